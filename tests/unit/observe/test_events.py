"""Warnings and errors counted by kind, for trt_worker_errors_total, from structlog events and
from plain logging records (librdkafka's own lines, the engines' warnings)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator

import confluent_kafka as ck
import pytest
import structlog

from worker.config.kafka import KafkaSettings
from worker.kafka.clients import common_settings
from worker.logs import configure_logging
from worker.observe import events


@pytest.fixture
def counts() -> Iterator[Counter[str]]:
    configure_logging("INFO")
    before = events.COUNTS.copy()
    events.COUNTS.clear()
    try:
        yield events.COUNTS
    finally:
        events.COUNTS.clear()
        events.COUNTS.update(before)


def test_structlog_warnings_count_by_event_name(counts: Counter[str]) -> None:
    log = structlog.get_logger("worker")
    log.warning("commit_failed", error="x")
    log.info("worker_started")
    log.error("job_dead_lettered", reason="not_msgpack")  # its own series
    assert counts == {"commit_failed": 1}


def test_librdkafka_lines_count_by_facility(counts: Counter[str]) -> None:
    rd = logging.getLogger("librdkafka")
    # As confluent-kafka logs them: the facility, the client's name, the thread, the text.
    rd.warning("GETPID [w#producer-1] [thrd:main]: Failed to acquire idempotence PID from "
               "broker 127.0.0.1:53775/1: Broker: Coordinator load in progress: retrying")
    rd.error("FAIL [w#consumer-2] [thrd:127.0.0.1:1/bootstrap]: Connection refused")
    rd.info("CGRPOP [w#consumer-2] [thrd:main]: joined")
    rd.warning("no facility at all")
    assert counts == {"librdkafka_GETPID": 1, "librdkafka_FAIL": 1, "librdkafka_other": 1}


def test_other_stdlib_warnings_count_by_their_leading_name(counts: Counter[str]) -> None:
    engines = logging.getLogger("engines")
    engines.error("engine_cache_entry_corrupt: %s; removed, it is built again", "hash differs")
    engines.info("engine_activated: open_nsfw on cuda:0, {}")
    logging.getLogger("py.warnings").warning("/x/y.py:3: UserWarning: something")
    assert counts == {"engine_cache_entry_corrupt": 1, "py.warnings": 1}


def test_a_real_client_s_failures_are_counted(counts: Counter[str]) -> None:
    # A port nothing listens on: librdkafka logs its connection failures (facility FAIL)
    # through the worker's client settings, served by poll().
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", client_id="events-test")
    producer = ck.Producer(common_settings(settings) | {"reconnect.backoff.ms": 50})
    deadline = time.monotonic() + 15
    while not any(k.startswith("librdkafka_") for k in counts) and time.monotonic() < deadline:
        producer.poll(0.2)
    assert any(k.startswith("librdkafka_") and k != "librdkafka_other" for k in counts), counts
