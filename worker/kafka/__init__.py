"""A thin typed layer over confluent-kafka: config builders and client wrappers.

No network in any constructor: clients connect in ``open()``. The worker's own consumer logic
(decode, backpressure, offsets, transactions) lives above this, in :mod:`worker.loop.worker` and
:mod:`worker.loop.commit.transactions`.
"""

from worker.kafka.clients import (
    Producer,
    consumer_settings,
    is_fatal,
    is_static_fencing,
    member_consumer_settings,
    producer_settings,
    source_record,
    transactional_id,
    transactional_producer_settings,
    txn_error,
)
from worker.kafka.consumer import Consumer

__all__ = [
    "Consumer",
    "Producer",
    "consumer_settings",
    "is_fatal",
    "is_static_fencing",
    "member_consumer_settings",
    "producer_settings",
    "source_record",
    "transactional_id",
    "transactional_producer_settings",
    "txn_error",
]
