"""Contract v1 and v2 side by side on a real broker: one worker (open_nsfw-only default policy,
ONNX Runtime on the CPU) answers each job in the version its ``v`` names, and dead-letters a
version it does not speak, naming it."""

from __future__ import annotations

import re
from typing import Any

import msgpack
import pytest

from tests.contract import Contract
from tests.harness.workers import (
    ThreadedWorker,
    fresh_topics,
    keys_of,
    produce_records,
    read_topic,
    worker_config,
)
from worker.bundled import samples_dir
from worker.tools.produce import encode_job
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration
RESULTS = {"job-v1", "job-v2", "job-v2-late"}
DEAD = {"job-v3": ("unsupported_version", "3"), "job-v2-text": ("nothing_to_score", "2")}


def _records(jpeg: bytes) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    def job(job_id: str, version: int, value: bytes) -> tuple[bytes, bytes,
                                                               list[tuple[str, bytes]]]:
        return job_id.encode(), value, [("ktw.schema", f"moderation-job/v{version}".encode())]

    return [
        job("job-v1", 1, encode_job("job-v1", jpeg)),
        job("job-v2", 2, encode_job("job-v2", jpeg, version=2)),
        job("job-v2-late", 2, encode_job("job-v2-late", jpeg, deadline_ms=1, version=2)),
        job("job-v3", 3, msgpack.packb({"v": 3, "id": "job-v3", "image": jpeg})),
        # Valid v2, but the default policy runs open_nsfw only: nothing to score.
        job("job-v2-text", 2, msgpack.packb({"v": 2, "id": "job-v2-text", "text": "hello"})),
    ]


def _by_key(msgs: list[Any]) -> dict[str, tuple[dict[str, Any], dict[str, bytes]]]:
    return {m.key().decode(): (decode_result(m.value()), dict(m.headers() or []))
            for m in msgs}


def test_a_v1_and_a_v2_job_are_answered_side_by_side(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(kafka_bootstrap, topics)
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()
    produce_records(kafka_bootstrap, topics.jobs, _records(jpeg))
    with ThreadedWorker(cfg):
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: set(keys_of(m)) >= RESULTS)
        dead = read_topic(kafka_bootstrap, topics.dlq,
                          until=lambda m: set(keys_of(m)) >= set(DEAD))
    got = _by_key(results)
    assert set(got) == RESULTS
    contract = Contract()
    (v1, h1), (v2, h2), (late, h3) = (got[k] for k in ("job-v1", "job-v2", "job-v2-late"))

    # v1, exactly as before v2: open_nsfw's plain labels, no rule, no models.
    assert h1["ktw.schema"] == b"moderation-result/v1"
    assert v1["v"] == 1 and set(v1["scores"]) == {"sfw", "nsfw"}
    assert not {"rule", "models"} & set(v1)
    assert contract.errors("moderation-result", v1) == []

    # v2: one shape, the image-and-text one.
    assert h2["ktw.schema"] == h3["ktw.schema"] == b"moderation-result/v2"
    assert v2["v"] == 2 and set(v2["scores"]) == {"open_nsfw.sfw", "open_nsfw.nsfw"}
    assert v2["scores"]["open_nsfw.nsfw"] == pytest.approx(v1["scores"]["nsfw"], abs=1e-5)
    assert v2["verdict"] == v1["verdict"] == "allow"
    assert (v2["rule"], v2["models"]) == ("allow", ["open_nsfw"])
    assert contract.errors("moderation-result.v2", v2) == []
    assert (late["status"], late["rule"], late["models"], late["scores"]) == (
        "expired", "none", [], {})
    assert contract.errors("moderation-result.v2", late) == []

    # The engine hash has the form the schema examples show (the engine cache's).
    for doc, headers in got.values():
        assert headers["ktw.engine"].decode() == doc["engine_hash"]
        assert re.fullmatch(r"onnxruntime-[0-9a-f]{12}", doc["engine_hash"])

    # A version the worker does not speak, and a v2 job it cannot serve, are dead-lettered;
    # the DLQ record names the job's version.
    assert sorted(keys_of(dead)) == sorted(DEAD)
    for m in dead:
        h = {k: (v or b"").decode() for k, v in m.headers() or []}
        reason, version = DEAD[m.key().decode()]
        assert (h["ktw.dlq.error.reason"], h["ktw.dlq.source.v"]) == (reason, version)
