"""Property-based fuzzing of the whole intake path.

The intake is: msgpack decode + contract checks (worker.wire.moderation_codec), then image
decode + bomb guards + preprocessing (worker.tasks.moderation.images.cpu). Whatever the bytes,
the only outcomes allowed are a job with a preprocessed image, or a JobRejected (which the
loop dead-letters with its reason). Any other exception would crash the worker.
tests/unit/wire/test_moderation_codec.py fuzzes the codec alone with
arbitrary bytes and maps; this file mutates *valid* jobs and images, where the interesting bugs
live (a valid prefix, a plausible header, a corrupted body), and fuzzes nested documents.
"""

from __future__ import annotations

import functools
import io

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from worker.exceptions import ImageRejected, JobRejected
from worker.tasks.moderation.images.cpu import ImageLimits, decode_image
from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw
from worker.tasks.moderation.results import no_image
from worker.tools.produce import encode_job
from worker.wire.moderation_codec import DecodeLimits, decode_moderation_job

LIMITS = DecodeLimits(max_image_bytes=256 * 1024, max_text_chars=2000)
IMAGE_LIMITS = ImageLimits(max_pixels=4_000_000, max_side=4096)
FUZZ = settings(max_examples=400, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@functools.lru_cache(maxsize=1)
def _images() -> dict[str, bytes]:
    rng = np.random.default_rng(6)
    img = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    out = {}
    for fmt in ("JPEG", "PNG", "WEBP"):
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        out[fmt] = buf.getvalue()
    return out


def _intake(payload: bytes) -> np.ndarray | JobRejected:
    """What the worker does with one record, minus Kafka: a model input or a rejection."""
    try:
        job = decode_moderation_job(payload, LIMITS)
        if job.image is None:  # OpenNsfwTask.check_policy: a text-only job on open_nsfw
            return no_image(job)
        return preprocess_open_nsfw(decode_image(job.image, IMAGE_LIMITS))
    except JobRejected as exc:
        return exc


@st.composite
def _mutated(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[i: i + draw(st.integers(1, 16))]
        elif op == "truncate":
            del data[i:]
        else:
            j = draw(st.integers(0, len(data) - 1))
            data[i:i] = data[j: j + draw(st.integers(1, 64))]
    return bytes(data)


@FUZZ
@given(fmt=st.sampled_from(["JPEG", "PNG", "WEBP"]), data=st.data())
def test_mutated_images_give_an_input_or_image_rejected(fmt: str, data: st.DataObject) -> None:
    image = data.draw(_mutated(_images()[fmt]))
    try:
        x = preprocess_open_nsfw(decode_image(image, IMAGE_LIMITS))
    except ImageRejected:
        return
    assert x.shape == (224, 224, 3) and x.dtype == np.float32
    assert np.isfinite(x).all()


@FUZZ
@given(fmt=st.sampled_from(["JPEG", "PNG", "WEBP"]), data=st.data())
def test_mutated_whole_jobs_give_an_input_or_a_rejection(fmt: str, data: st.DataObject) -> None:
    payload = data.draw(_mutated(encode_job("fuzz-1", _images()[fmt], text="a caption")))
    out = _intake(payload)
    assert isinstance(out, (np.ndarray, JobRejected))
    if isinstance(out, JobRejected):
        assert out.reason and str(out), "every rejection names a reason and a message"


_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
            | st.text(max_size=20) | st.binary(max_size=64))
_NESTED = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)


@FUZZ
@given(fields=st.dictionaries(
    st.sampled_from(["v", "id", "image", "text", "policy", "deadline_ms", "extra"]), _NESTED,
    max_size=7))
def test_nested_documents_with_contract_keys_give_a_job_or_a_rejection(
    fields: dict[str, object]
) -> None:
    payload = msgpack.packb(fields, use_bin_type=True)
    out = _intake(payload)
    assert isinstance(out, (np.ndarray, JobRejected))


@FUZZ
@given(image=st.binary(max_size=2048))
def test_arbitrary_image_bytes_inside_a_valid_job_are_image_rejected_or_decoded(
    image: bytes,
) -> None:
    out = _intake(encode_job("fuzz-2", image or b"\x00"))
    assert isinstance(out, (np.ndarray, JobRejected))
