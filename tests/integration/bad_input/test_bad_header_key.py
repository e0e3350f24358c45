"""A job whose header key is not valid UTF-8 is dead-lettered by reference, reason bad_headers;
the worker keeps running and the good jobs on either side of it are answered.

Kafka header keys are bytes on the wire and Go, Rust and C clients write any bytes there, but
confluent-kafka-python's ``headers()`` raises on such a key (and its ``produce()`` turns a
bytes key into its ``str()`` text, so it cannot write one): the record is written by a small
Go program on franz-go (``rawheader/``). Before, the error escaped on the loop thread: the
worker stopped, and so did every restart on the same offset.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import confluent_kafka as ck
import pytest

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
from worker.bundled import samples_dir
from worker.kafka.headers import read_headers
from worker.tools.admin.deadletters import Filter
from worker.tools.admin.redrive import RedriveRequest, redrive
from worker.tools.produce import encode_job
from worker.wire.moderation_codec import decode_result

pytestmark = [pytest.mark.integration, pytest.mark.slow]
RAWHEADER = Path(__file__).resolve().parent / "rawheader"
BAD_KEY = b"\xff\xfe"


@pytest.fixture(scope="module")
def rawheader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go producer, built once per module (its modules come from the Go module proxy the
    first time, then from the local module cache)."""
    if shutil.which("go") is None:
        pytest.skip("needs Go: confluent-kafka-python cannot write a header key that is not "
                    "UTF-8")
    out = tmp_path_factory.mktemp("rawheader") / "rawheader"
    build = subprocess.run(["go", "build", "-o", str(out), "."], cwd=RAWHEADER,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def _produce_bad(rawheader: Path, bootstrap: str, topic: str, key: str, value: bytes) -> int:
    run = subprocess.run([str(rawheader), bootstrap, topic, "0", key, BAD_KEY.hex(), "v"],
                         input=value, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    partition, offset = map(int, run.stdout.split())
    assert partition == 0
    return offset


def _until(alive: Callable[[], bool], keys: set[str]) -> Callable[[list[ck.Message]], bool]:
    """Read until every key is there, or at once when the worker has stopped."""
    return lambda msgs: not alive() or keys <= set(keys_of(msgs))


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_header_key_that_is_not_utf8_is_dead_lettered_by_reference(
        kafka_bootstrap: str, rawheader: Path, mode: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=1)
    cfg = worker_config(kafka_bootstrap, topics, processing={"guarantee": mode})
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()
    bad_value = encode_job("bad-header-key", jpeg)
    # One partition, in this order: good, bad, good.
    produce_records(kafka_bootstrap, topics.jobs,
                    [(b"good-before", encode_job("good-before", jpeg), [("tenant", b"t1")])])
    bad_offset = _produce_bad(rawheader, kafka_bootstrap, topics.jobs, "bad-header-key",
                              bad_value)
    produce_records(kafka_bootstrap, topics.jobs,
                    [(b"good-after", encode_job("good-after", jpeg), None)])

    # The record really carries a key this client cannot read (else the test proves nothing).
    jobs = read_topic(kafka_bootstrap, topics.jobs, until=lambda m: len(m) >= 3, timeout=60)
    [src] = [m for m in jobs if m.offset() == bad_offset]
    # First many readable records, as a worker reads them before it meets the bad one: once
    # CPython has specialised a plain ``msg.headers()`` call site, the client's error no longer
    # raises there but later, outside any guard (what worker.kafka.headers works around).
    for _ in range(100):
        for m in jobs:
            if m is not src:
                assert read_headers(m)[1] is None
    headers, why = read_headers(src)
    assert headers is None and why is not None, "the Go client's record reads fine"

    good = {"good-before", "good-after"}
    with ThreadedWorker(cfg) as tw:
        alive = tw.thread.is_alive
        dead = read_topic(kafka_bootstrap, topics.dlq, until=_until(alive, {"bad-header-key"}))
        results = read_topic(kafka_bootstrap, topics.results, until=_until(alive, good))
        assert tw.thread.is_alive(), f"the worker stopped on the record: {tw.error!r}"

    assert sorted(keys_of(results)) == sorted(good)
    assert all(decode_result(m.value())["status"] == "ok" for m in results)
    [dl] = dead
    assert dl.key() == b"bad-header-key"
    h = {k: (v or b"").decode() for k, v in dl.headers() or []}
    assert h["ktw.dlq.error.reason"] == "bad_headers"
    assert h["ktw.dlq.error.class"] == "UnreadableHeaders"
    assert "UnicodeDecodeError" in h["ktw.dlq.error.message"], h["ktw.dlq.error.message"]
    assert h["ktw.dlq.value"] == "reference"
    assert (h["ktw.dlq.source.topic"], h["ktw.dlq.source.offset"]) == (topics.jobs,
                                                                        str(bad_offset))
    ref = json.loads(dl.value())
    assert (ref["topic"], ref["partition"], ref["offset"]) == (topics.jobs, 0, bad_offset)
    assert ref["bytes"] == len(bad_value) and ref["headers"] is None
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 1) == end_offsets(
        kafka_bootstrap, topics.jobs, 1)

    # The redrive fetches the source of a by-reference dead letter: it reads it without its
    # unreadable headers instead of stopping (a dry run: nothing is sent).
    dry = redrive(cfg, RedriveRequest(Filter(frozenset({"bad_headers"})), dry_run=True))
    assert (dry.matched, dry.resent, dict(dry.skipped)) == (1, 1, {})
