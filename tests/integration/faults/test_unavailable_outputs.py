"""A results topic that refuses or loses records never stops an at-least-once worker.

- results larger than the results topic takes: each job is dead-lettered as
  ``result_too_large`` (before: at-least-once stopped, and every restart died on the same
  offset; exactly-once aborted and rewound forever);
- the results topic deleted while the worker runs, then created again: deliveries that fail
  after librdkafka's own retries are produced again with backoff, nothing is committed past
  them, and every job is answered once the topic is back (before: the worker exited).
"""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest

from tests.harness.faults import good_job
from tests.harness.workers import (
    ThreadedWorker,
    committed,
    end_offsets,
    fresh_topics,
    keys_of,
    produce_records,
    read_topic,
    worker_config,
)
from worker.devkit.local_kafka.admin import create_topics

pytestmark = pytest.mark.integration


def _recreate(bootstrap: str, topic: str, config: dict[str, str] | None = None) -> None:
    admin = ck.admin.AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics([topic], operation_timeout=30).values():
        f.result()
    if config is not None:
        create_topics(bootstrap, [topic], partitions=1, config=config)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_results_too_large_for_their_topic_are_dead_lettered(kafka_bootstrap: str,
                                                             mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    _recreate(kafka_bootstrap, topics.results, {"max.message.bytes": "100"})
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    keys = [f"job-{i}" for i in range(6)]
    produce_records(kafka_bootstrap, topics.jobs, [(k.encode(), good_job(k), None)
                                                    for k in keys])
    with ThreadedWorker(cfg) as w:
        dlq = read_topic(kafka_bootstrap, topics.dlq, until=lambda m: len(m) >= len(keys),
                         timeout=90)
        assert w.worker.fatal_error is None
    assert sorted(keys_of(dlq)) == keys
    for msg in dlq:
        headers = dict(msg.headers() or [])
        assert headers["ktw.dlq.error.reason"] == b"result_too_large"
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)


def test_a_results_topic_that_disappears_and_returns_loses_nothing(
        kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(kafka_bootstrap, topics,
                        kafka={"producer_extra": {"message.timeout.ms": "3000"}})
    first = [f"a-{i}" for i in range(4)]
    later = [f"b-{i}" for i in range(6)]
    with ThreadedWorker(cfg) as w:
        produce_records(kafka_bootstrap, topics.jobs, [(k.encode(), good_job(k), None)
                                                        for k in first])
        read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= len(first))
        _recreate(kafka_bootstrap, topics.results)  # gone
        produce_records(kafka_bootstrap, topics.jobs, [(k.encode(), good_job(k), None)
                                                        for k in later])
        deadline = time.monotonic() + 60
        while w.worker.committer.totals()["delivery_retries"] < 2:
            assert time.monotonic() < deadline, "deliveries to the missing topic never retried"
            assert w.worker.fatal_error is None
            time.sleep(0.2)
        # Nothing past the unanswered jobs was committed meanwhile.
        assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) != end_offsets(
            kafka_bootstrap, topics.jobs, 2)
        create_topics(kafka_bootstrap, [topics.results], partitions=1)  # back
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: set(later) <= set(keys_of(m)), timeout=120)
        assert set(later) <= set(keys_of(results))
        assert w.worker.fatal_error is None
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_compacted_dlq_topic_takes_a_keyless_dead_letter_by_reference(
        kafka_bootstrap: str, mode: str) -> None:
    """A compacted DLQ topic refuses records without a key (INVALID_RECORD): a bad job sent
    without one goes to the DLQ by reference, keyed by its source coordinates (before: the
    worker exited, at-least-once; rewound forever, exactly-once)."""
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    _recreate(kafka_bootstrap, topics.dlq, {"cleanup.policy": "compact"})
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    produce_records(kafka_bootstrap, topics.jobs, [(None, b"\xc1 not msgpack", None),
                                                    (b"good-0", good_job("good-0"), None)])
    with ThreadedWorker(cfg) as w:
        dlq = read_topic(kafka_bootstrap, topics.dlq, until=lambda m: len(m) >= 1, timeout=90)
        results = read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 1)
        assert w.worker.fatal_error is None
    assert [m.key() for m in dlq] == [f"{topics.jobs}/0/0".encode()]
    headers = dict(dlq[0].headers() or [])
    assert headers["ktw.dlq.value"] == b"reference"
    assert headers["ktw.dlq.error.reason"] == b"not_msgpack"
    assert keys_of(results) == ["good-0"]
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 1) == end_offsets(
        kafka_bootstrap, topics.jobs, 1)


def test_a_stuck_output_holds_its_partition_at_the_uncommitted_limit(
        kafka_bootstrap: str) -> None:
    """The DLQ gone while results still work: one dead letter cannot be delivered, every job
    behind it is answered, and the committed position stays before the dead letter. Nothing
    bounded what was consumed past it (the offset bookkeeping grew one entry per record, and a
    restart would repeat all of it); now the partition is paused at
    ``batch.max_uncommitted_per_partition`` with readiness saying why, and released once the
    DLQ is back, with everything answered and committed."""
    limit = 100
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    # One consume() takes up to the high watermark: below the jobs sent (4 x limit), so a
    # consume that took them all at once cannot pass for a partition that was never held.
    cfg = worker_config(kafka_bootstrap, topics,
                        batch={"max_uncommitted_per_partition": limit,
                               "high_watermark": 2 * limit, "low_watermark": limit // 2},
                        kafka={"producer_extra": {"message.timeout.ms": "3000"}})
    good = [f"g-{i}" for i in range(4 * limit)]
    assert limit + cfg.batch.high_watermark < len(good)
    with ThreadedWorker(cfg) as w:
        produce_records(kafka_bootstrap, topics.jobs, [(b"warm", good_job("warm"), None)])
        read_topic(kafka_bootstrap, topics.results, until=lambda m: len(m) >= 1)
        _recreate(kafka_bootstrap, topics.dlq)  # gone
        produce_records(kafka_bootstrap, topics.jobs, [(b"bad", b"\xc1 not msgpack", None)]
                        + [(k.encode(), good_job(k), None) for k in good])
        deadline = time.monotonic() + 90
        while not w.worker.hold.held:
            assert time.monotonic() < deadline, "the partition was never held"
            assert w.worker.fatal_error is None
            time.sleep(0.2)
        spans = w.worker.committer.uncommitted()
        time.sleep(3.0)  # held: nothing more is taken from it
        assert w.worker.committer.uncommitted() == spans
        # At most one consume() past the limit (it takes up to the high watermark).
        bound = limit + cfg.batch.high_watermark
        assert max(spans.values()) <= bound, spans
        answered = len(read_topic(kafka_bootstrap, topics.results,
                                  until=lambda m: False, timeout=8))
        assert answered <= 1 + bound and answered < 1 + len(good)
        reason = w.worker.hold.reason()
        assert reason is not None and "uncommitted" in reason
        create_topics(kafka_bootstrap, [topics.dlq], partitions=1)  # back
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: set(good) <= set(keys_of(m)), timeout=120)
        assert set(good) <= set(keys_of(results))
        dlq = read_topic(kafka_bootstrap, topics.dlq, until=lambda m: len(m) >= 1, timeout=60)
        assert len(dlq) >= 1
        deadline = time.monotonic() + 30
        while w.worker.hold.held:
            assert time.monotonic() < deadline, "the partition was never released"
            time.sleep(0.2)
        assert w.worker.fatal_error is None
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 1) == end_offsets(
        kafka_bootstrap, topics.jobs, 1)
