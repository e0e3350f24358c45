"""worker.wire.moderation_codec reads most jobs with msgspec and packs results with it: the
same jobs accepted into the same ModerationJob, the same refusals with the same reasons, and
the same result bytes as the msgpack path (``_decoded``) and msgpack's ``packb``."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.exceptions import JobRejected
from worker.wire import moderation_codec as codec
from worker.wire.moderation_codec import (
    DecodeLimits,
    decode_moderation_job,
    encode_result,
    result_to_dict,
)
from worker.wire.moderation_jobs import ModerationJob, ModerationResult, Status, Verdict
from worker.wire.records import SourceRef

FUZZ = settings(max_examples=1500, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])
LIMITS = [None, DecodeLimits(max_image_bytes=8, max_text_chars=5)]

_KEYS = st.sampled_from(["v", "id", "image", "text", "policy", "deadline_ms", "other"])
_TEXT = st.text(alphabet=st.sampled_from(["a", " ", "\n", "\u3000", "\ufeff", "\x85", "\x1c",
                                          "é", "\U0001f600", ".", "-", "_", "Z", "0"]),
                max_size=8)
_VALUE = st.one_of(
    st.none(), st.booleans(), _TEXT, st.binary(max_size=10),
    st.sampled_from([0, 1, 2, 3, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 1.0, 0.5,
                     "default", "Default", "p.1", "p\n", "", "x" * 257, "x" * 256,
                     msgpack.ExtType(5, b"ab"), msgpack.Timestamp(1, 0), [], {}, [1], {"a": 1},
                     b""]),
)


def _map(pairs: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map of these pairs in this order, duplicates kept (a dict would drop them)."""
    out = bytearray(msgpack.Packer(use_bin_type=True).pack_map_header(len(pairs)))
    for k, v in pairs:
        out += msgpack.packb(k, use_bin_type=True) + msgpack.packb(v, use_bin_type=True)
    return bytes(out)


def _outcome(decode: Any, payload: bytes, limits: DecodeLimits | None) -> Any:
    try:
        return decode(payload, limits)
    except JobRejected as exc:
        return (type(exc), exc.reason, str(exc))


def _same_as_msgpack_path(payload: bytes) -> None:
    for limits in LIMITS:
        got = _outcome(decode_moderation_job, payload, limits)
        want = _outcome(codec._decoded, payload, limits or codec._DEFAULT_LIMITS)
        assert got == want, (payload, limits)
        assert type(got) is type(want)


@FUZZ
@given(st.lists(st.tuples(_KEYS, _VALUE), max_size=8))
def test_any_map_of_job_fields_decodes_as_the_msgpack_path_decodes_it(
        pairs: list[tuple[str, Any]]) -> None:
    _same_as_msgpack_path(_map(pairs))


_JOBS = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 2]), "id": _TEXT},
    optional={"image": st.binary(max_size=10), "text": _TEXT,
              "policy": st.one_of(_TEXT, st.sampled_from(["default", "p.1", "p\n"])),
              "deadline_ms": st.one_of(st.integers(-2, 2**64 - 1),
                                       st.sampled_from([2**63 - 1, 2**63]))})


@FUZZ
@given(_JOBS, st.lists(st.tuples(st.integers(0, 8), _KEYS, _VALUE), max_size=2))
def test_jobs_with_pairs_spliced_in_decode_as_the_msgpack_path_decodes_them(
        job: dict[str, Any], extra: list[tuple[int, str, Any]]) -> None:
    """Mostly valid jobs; the spliced pairs repeat a key, add a nil, another type or field."""
    pairs = list(job.items())
    _same_as_msgpack_path(_map(pairs))
    for at, key, value in extra:
        pairs.insert(at, (key, value))
    _same_as_msgpack_path(_map(pairs))


@FUZZ
@given(_JOBS, st.data())
def test_mutated_jobs_decode_as_the_msgpack_path_decodes_them(job: dict[str, Any],
                                                               data: st.DataObject) -> None:
    payload = bytearray(_map(list(job.items())))
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at] = data.draw(st.integers(0, 255))
    _same_as_msgpack_path(bytes(payload))
    _same_as_msgpack_path(bytes(payload[:at]))


@pytest.mark.parametrize("pairs", [
    [("v", 1), ("v", 1), ("id", "a"), ("text", "t")],
    [("v", 1), ("id", "a"), ("text", "t"), ("text", "u")],
    [("v", 1), ("id", "a"), ("text", "t"), ("policy", "default"), ("policy", "default")],
    [("v", 1), ("id", "a"), ("text", "t"), ("policy", None), ("policy", "p")],
], ids=["v", "text", "default-policy", "nil-then-policy"])
def test_a_duplicate_key_msgspec_would_take_is_refused(pairs: list[tuple[str, Any]]) -> None:
    with pytest.raises(JobRejected, match="duplicate key"):
        decode_moderation_job(_map(pairs))


def test_a_plain_job_never_reaches_the_msgpack_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(payload: bytes, limits: DecodeLimits) -> ModerationJob:
        raise AssertionError("the msgpack path decoded a plain job")

    monkeypatch.setattr(codec, "_decoded", refuse)
    jobs = [{"v": 1, "id": "j-1", "text": "lorem ipsum " * 80},
            {"v": 2, "id": "j-2", "image": b"\xff\xd8" * 300, "policy": "strict.v2",
             "deadline_ms": 1_900_000_000_000},
            {"v": 1, "id": "j-3", "image": b"\xff\xd8", "text": " "}]
    for job in jobs:
        got = decode_moderation_job(msgpack.packb(job, use_bin_type=True))
        assert got == ModerationJob(job["id"], job.get("image"), job.get("text"),
                                    job.get("policy", "default"), job.get("deadline_ms"),
                                    job["v"])


_SCORE = st.one_of(st.floats(allow_nan=False), st.integers(-(2**63), 2**64 - 1),
                   st.floats(-1e3, 1e3).map(np.float64))
_RESULTS = st.builds(
    ModerationResult,
    id=st.text(max_size=300), status=st.sampled_from(list(Status)),
    policy=st.text(max_size=40), model_id=st.text(max_size=40),
    engine_hash=st.sampled_from(["", "e" * 64]),
    verdict=st.one_of(st.none(), st.sampled_from(list(Verdict))),
    scores=st.dictionaries(st.text(max_size=20), _SCORE, max_size=4),
    timings_ms=st.dictionaries(st.text(max_size=10), st.floats(0, 1e6), max_size=4),
    error=st.one_of(st.none(), st.text(max_size=40)
                    | st.just("e" * 70_000)),
    source=st.one_of(st.none(), st.builds(SourceRef, st.text(max_size=249),
                                          st.integers(0, 2**31 - 1),
                                          st.integers(0, 2**63 - 1))),
    rule=st.one_of(st.none(), st.text(max_size=40)),
    models=st.lists(st.text(max_size=10), max_size=3).map(tuple),
    schema_version=st.sampled_from([1, 2]),
)


@settings(max_examples=800, deadline=None, database=None)
@given(_RESULTS)
def test_a_result_packs_to_the_bytes_msgpack_packs(result: ModerationResult) -> None:
    try:
        doc = result_to_dict(result)
    except ValueError:  # a v2 ok result without rule or models: refused before packing
        return
    assert encode_result(result) == msgpack.packb(doc, use_bin_type=True)


def test_a_value_msgpack_cannot_pack_is_a_type_error_still() -> None:
    r = ModerationResult(id="a", status=Status.OK, policy="p", model_id="m", engine_hash="e",
                         scores={"x": np.float32(0.5)})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        msgpack.packb(result_to_dict(r), use_bin_type=True)
    with pytest.raises(TypeError):
        encode_result(r)
