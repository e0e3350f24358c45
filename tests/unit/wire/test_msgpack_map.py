"""worker.wire.msgpack_map.unpack_map: containers bounded before they are built."""

from __future__ import annotations

import tracemalloc

import msgpack
import pytest

from worker.exceptions import JobRejected, MalformedPayload, SchemaViolation
from worker.wire.msgpack_map import MAX_CONTAINERS, unpack_map


def _peak_bytes(payload: bytes) -> tuple[JobRejected, int]:
    tracemalloc.start()
    try:
        with pytest.raises(JobRejected) as info:
            unpack_map(payload)
        return info.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_array_is_refused_from_its_header() -> None:
    # 1 MB of empty maps: unbounded, ~73 MB of dicts before any field check could run.
    error, peak = _peak_bytes(msgpack.packb({"v": 1, "id": "x", "text": [{}] * 1_000_000}))
    assert isinstance(error, MalformedPayload) and "max_array_len" in str(error)
    assert peak < 8 << 20


def test_many_small_containers_are_refused_once_past_the_budget() -> None:
    error, peak = _peak_bytes(msgpack.packb({"v": 1, "id": "x",
                                             "text": [[{}] * 1000] * 1000}))
    assert isinstance(error, SchemaViolation)
    assert f"more than {MAX_CONTAINERS} nested maps or arrays" in str(error)
    assert peak < 8 << 20


def test_contract_documents_are_far_inside_the_bounds() -> None:
    job = {"v": 1, "id": "j", "text": "t", "image": b"\xff" * 10, "policy": "default"}
    assert unpack_map(msgpack.packb(job)) == job
    result = {"v": 1, "images": [{"seed": i, "png": b"x"} for i in range(64)],
              "scores": {f"m.l{i}": 0.5 for i in range(200)}}
    assert unpack_map(msgpack.packb(result)) == result
