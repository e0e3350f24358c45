"""Each class of bad job lands in the DLQ with its reason; good jobs around it are answered."""

from __future__ import annotations

import struct
import zlib

import msgpack
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
from worker.tools.produce import encode_job
from worker.wire.moderation_codec import decode_result

pytestmark = pytest.mark.integration


def _png_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A tiny, valid-looking PNG whose header declares ``width`` x ``height`` pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _bad_jobs(jpeg: bytes) -> dict[str, tuple[bytes | None, str]]:
    """key -> (value, expected reason). Limits in the test config: image 150 KiB, record 300 KB."""
    def job(**fields: object) -> bytes:
        return msgpack.packb({"v": 1, **fields}, use_bin_type=True)

    return {
        "bad-not-msgpack": (b"\xc1 this is not msgpack", "not_msgpack"),
        "bad-not-a-map": (msgpack.packb([1, "id", b"img"]), "not_msgpack"),
        "bad-invalid-utf8": (b"\x83\xa1v\x01\xa2id\xa2\xff\xfe\xa5image\xc4\x01x", "not_msgpack"),
        "bad-wrong-type": (job(id=123, image=jpeg), "schema"),
        "bad-missing-image": (job(id="bad-missing-image"), "schema"),
        "bad-unknown-v": (msgpack.packb({"v": 3, "id": "x", "image": jpeg}), "unsupported_version"),
        "bad-tombstone": (None, "schema"),
        "bad-unknown-policy": (encode_job("bad-unknown-policy", jpeg, policy="nope"),
                               "unknown_policy"),
        "bad-undecodable": (encode_job("bad-undecodable", b"\x00\x01garbage" * 10), "bad_image"),
        "bad-truncated-jpeg": (encode_job("bad-truncated-jpeg", jpeg[: len(jpeg) // 3]),
                               "bad_image"),
        "bad-zero-image": (job(id="bad-zero-image", image=b""), "schema"),
        "bad-png-bomb": (encode_job("bad-png-bomb", _png_bomb()), "bad_image"),
        "bad-oversized-image": (encode_job("bad-oversized-image", b"\xff" * 200_000), "schema"),
        "bad-oversized-record": (b"\x00" * 400_000, "oversized"),
    }


def test_each_bad_job_class_goes_to_dlq_with_reason(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, partitions=2)
    cfg = worker_config(kafka_bootstrap, topics,
                        limits={"max_image_bytes": 150 * 1024, "max_message_bytes": 300_000})
    jpeg = (samples_dir() / "astronaut.jpg").read_bytes()
    bad = _bad_jobs(jpeg)
    good = [f"good-{i}" for i in range(len(bad) + 1)]
    original_headers = [("trace", b"abc"), ("tenant", b"t1")]
    records = []
    # Interleave: good, bad, good, bad, ... so good jobs surround every bad one.
    for i, (key, (value, _)) in enumerate(bad.items()):
        records.append((good[i].encode(), encode_job(good[i], jpeg), None))
        records.append((key.encode(), value, original_headers))
    records.append((good[-1].encode(), encode_job(good[-1], jpeg), None))
    produce_records(kafka_bootstrap, topics.jobs, records)

    with ThreadedWorker(cfg) as tw:
        dead = read_topic(kafka_bootstrap, topics.dlq, until=lambda m: set(bad) <= set(keys_of(m)))
        results = read_topic(kafka_bootstrap, topics.results,
                             until=lambda m: set(good) <= set(keys_of(m)))
        assert tw.thread.is_alive(), "the worker must keep running after bad input"

    assert sorted(keys_of(dead)) == sorted(bad)
    sent = {k: v for k, v, _ in records}
    for msg in dead:
        key = msg.key().decode()
        headers = msg.headers() or []
        assert headers[: len(original_headers)] == original_headers, "original headers first"
        h = {k: (v or b"").decode() for k, v in headers}
        assert h["ktw.dlq.error.reason"] == bad[key][1], (key, h["ktw.dlq.error.message"])
        assert h["ktw.dlq.error.class"] and h["ktw.dlq.error.message"]
        assert h["ktw.dlq.source.topic"] == topics.jobs
        assert int(h["ktw.dlq.source.offset"]) >= 0
        assert msg.value() == sent[key.encode()], "original value untouched"

    assert sorted(keys_of(results)) == sorted(good)
    assert all(decode_result(m.value())["status"] == "ok" for m in results)
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2
    )
