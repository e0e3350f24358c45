"""A thin typed layer over confluent-kafka: config builders and client wrappers.

No network in any constructor: clients connect in ``open()``. The worker's own consumer logic
(decode, backpressure, offsets) lives above this, in :mod:`worker.service`.
"""

from worker.kafka.clients import Consumer, Producer, consumer_settings, producer_settings

__all__ = ["Consumer", "Producer", "consumer_settings", "producer_settings"]
