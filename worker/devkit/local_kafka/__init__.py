"""A real single-node Apache Kafka 4.x (KRaft) broker for tests and demos, and a 3-node
cluster (LocalKafkaCluster) for cluster-level fault drills.

Jars come from Maven Central via `mvn` (see pom.xml); the broker runs as a
plain `java -cp libs/* kafka.Kafka` child process. No Docker, no tarball.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .broker import LocalKafka
from .cluster import LocalKafkaCluster
from .errors import LocalKafkaError
from .jars import DEFAULT_VERSION, ensure_jars, jar_cache_root
from .security import Principal, Security

__all__ = [
    "DEFAULT_VERSION",
    "LocalKafka",
    "LocalKafkaCluster",
    "LocalKafkaError",
    "Principal",
    "Security",
    "ensure_jars",
    "jar_cache_root",
    "kafka_from_env_or_local",
]

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


@contextlib.contextmanager
def kafka_from_env_or_local(**kw: Any) -> Iterator[str]:
    """Yield $KAFKA_BOOTSTRAP_SERVERS if set (starting nothing), else a LocalKafka's.

    `kw` goes to LocalKafka(); `start_timeout` (seconds) is passed to start().
    """
    external = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if external:
        yield external
        return
    start_timeout = float(kw.pop("start_timeout", 90.0))
    broker = LocalKafka(**kw)
    try:
        yield broker.start(timeout=start_timeout)
    finally:
        broker.stop()
