"""msgpack <-> generation jobs and results, validated by hand like worker.wire.moderation_codec.

Contract-level checks live here (types, ranges, the scheduler names); checks against this
worker's configuration (sizes it has engines for, its step range, images per job) are in
:mod:`worker.tasks.generation.intake`. ``tests/unit/wire/test_generation_schemas.py`` keeps this
module and ``schemas/generation-*.schema.json`` in agreement.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgpack

from worker.exceptions import SchemaViolation
from worker.tasks.generation.schedulers import SCHEDULERS
from worker.wire.generation_jobs import (
    SEED_MODULUS,
    BlobRef,
    Check,
    GenerationJob,
    GenerationResult,
)
from worker.wire.job_maps import NON_BLANK, refuse_duplicate_keys

# The msgpack framing rules (no ext types, UTF-8 strings, a map at the top) are the same for
# every payload of the contract, so they are shared rather than restated.
from worker.wire.msgpack_map import (
    INT64_MAX,
    MAX_ID_CHARS,
    check_envelope,
    require_str,
    type_name,
    unpack_map,
)
from worker.wire.versions import V1, VERSIONS

MAX_PROMPT_CHARS = 2000
MIN_SIDE, MAX_SIDE, SIDE_MULTIPLE = 64, 2048, 8
MAX_STEPS = 150
MAX_GUIDANCE = 30.0
MAX_IMAGES = 64
MAX_SEED = SEED_MODULUS - 1
# The schema's prompt pattern: a character outside ECMA-262's whitespace (worker.wire.job_maps).
PROMPT_PRESENT = re.compile(NON_BLANK)
GENERATION_JOB_FIELDS = frozenset({
    "v", "id", "prompt", "negative_prompt", "width", "height", "steps", "guidance_scale",
    "scheduler", "seed", "num_images", "deadline_ms"})


_DEFAULTS = GenerationJob(id="", prompt="")  # the defaults live on the dataclass, in one place


def default_seed(job_id: str) -> int:
    """A job without a seed gets one derived from its id: a redelivered or replayed job
    produces the same images, which a random seed would not."""
    return int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big")


def _int(obj: dict[Any, Any], key: str, lo: int, hi: int, multiple: int = 1) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise SchemaViolation(f"field '{key}': expected integer, got {type_name(value)}")
    if not lo <= value <= hi or value % multiple:
        extra = f" and a multiple of {multiple}" if multiple > 1 else ""
        raise SchemaViolation(f"field '{key}': {value} must be in [{lo}, {hi}]{extra}")
    return value


def _guidance(obj: dict[Any, Any]) -> float | None:
    value = obj.get("guidance_scale")
    if value is None:
        return None
    if type(value) not in (int, float):
        raise SchemaViolation(f"field 'guidance_scale': expected number, got {type_name(value)}")
    if not 0.0 <= value <= MAX_GUIDANCE:  # also false for NaN
        raise SchemaViolation(f"field 'guidance_scale': {value} must be in [0, {MAX_GUIDANCE}]")
    return float(value)


def _header(obj: dict[Any, Any]) -> int:
    """The job's version, once its envelope and required fields are there."""
    version = check_envelope(obj, GENERATION_JOB_FIELDS, VERSIONS)
    for key in ("id", "prompt"):
        if key not in obj:
            raise SchemaViolation(f"missing required field '{key}'")
    return version


def decode_generation_job(payload: bytes) -> GenerationJob:
    """Decode and validate one generation job; raise a :class:`JobRejected` subclass if bad."""
    obj = unpack_map(payload)
    refuse_duplicate_keys(payload, obj)
    version = _header(obj)
    job_id = require_str(obj, "id", max_chars=MAX_ID_CHARS)
    prompt = require_str(obj, "prompt", max_chars=MAX_PROMPT_CHARS)
    if not PROMPT_PRESENT.search(prompt):
        raise SchemaViolation("field 'prompt': empty (only whitespace)")
    negative = ""
    if obj.get("negative_prompt") is not None:
        negative = require_str(obj, "negative_prompt", min_chars=0, max_chars=MAX_PROMPT_CHARS)
    scheduler = "ddim"
    if obj.get("scheduler") is not None:
        scheduler = require_str(obj, "scheduler", max_chars=16)
        if scheduler not in SCHEDULERS:
            raise SchemaViolation(f"field 'scheduler': unknown scheduler {scheduler!r} "
                                  f"(known: {', '.join(SCHEDULERS)})")
    sides = [_int(obj, k, MIN_SIDE, MAX_SIDE, SIDE_MULTIPLE) for k in ("width", "height")]
    steps = _int(obj, "steps", 1, MAX_STEPS)
    seed = _int(obj, "seed", 0, MAX_SEED)
    num_images = _int(obj, "num_images", 1, MAX_IMAGES)
    deadline = _int(obj, "deadline_ms", 0, INT64_MAX)
    guidance = _guidance(obj)
    d = _DEFAULTS
    return GenerationJob(
        id=job_id, prompt=prompt, negative_prompt=negative, width=sides[0] or d.width,
        height=sides[1] or d.height, steps=steps or d.steps,
        guidance_scale=d.guidance_scale if guidance is None else guidance,
        scheduler=scheduler, seed=default_seed(job_id) if seed is None else seed,
        num_images=num_images or d.num_images, deadline_ms=deadline, schema_version=version)


def encode_generation_job(job_id: str, prompt: str, *, negative_prompt: str | None = None,
                          width: int | None = None, height: int | None = None,
                          steps: int | None = None, guidance_scale: float | None = None,
                          scheduler: str | None = None, seed: int | None = None,
                          num_images: int | None = None, deadline_ms: int | None = None,
                          validate: bool = True, version: int = V1) -> bytes:
    """One generation job as msgpack (``schemas/generation-job.schema.json``, or the
    ``.v2`` one for ``version`` 2: the same fields).

    Fields left ``None`` are omitted and take the contract's defaults (a missing seed is derived
    from the id). With ``validate`` the payload is decoded back through
    :func:`decode_generation_job`, so a bad job raises :class:`JobRejected` here, at the
    producer, instead of reaching a DLQ; tests that need invalid jobs pass ``validate=False``.
    """
    optional: dict[str, Any] = {
        "negative_prompt": negative_prompt, "width": width, "height": height, "steps": steps,
        "guidance_scale": guidance_scale, "scheduler": scheduler, "seed": seed,
        "num_images": num_images, "deadline_ms": deadline_ms}
    doc: dict[str, Any] = {"v": version, "id": job_id, "prompt": prompt}
    doc.update({k: v for k, v in optional.items() if v is not None})
    payload: bytes = msgpack.packb(doc, use_bin_type=True)
    if validate:
        decode_generation_job(payload)
    return payload


def _blob(ref: BlobRef) -> dict[str, Any]:
    return {"uri": ref.uri, "sha256": ref.sha256, "bytes": ref.bytes,
            "content_type": ref.content_type}


def _check(check: Check) -> dict[str, Any]:
    return {"verdict": check.verdict.value, "scores": dict(check.scores), "rule": check.rule}


def generation_result_to_dict(result: GenerationResult) -> dict[str, Any]:
    """The result's wire map. Moderation fields (an image's verdict, scores, rule and
    quarantine; the prompt's check) are written as set: the task sets them on v2 results only
    (worker.tasks.generation.results), and v1's schema refuses them."""
    images = []
    for im in result.images:
        doc: dict[str, Any] = {"index": im.index, "seed": im.seed, "width": im.width,
                               "height": im.height}
        if im.blob is not None:
            doc["blob"] = _blob(im.blob)
        elif im.png is not None or not im.withheld:
            doc["png"] = im.png
        if im.check is not None:
            doc.update(_check(im.check))
        if im.quarantine is not None:
            doc["quarantine"] = _blob(im.quarantine)
        images.append(doc)
    out: dict[str, Any] = {
        "v": result.schema_version, "id": result.id, "status": result.status.value,
        "model_id": result.model_id, "engine_hashes": dict(result.engine_hashes),
        "random_weights": result.random_weights, "images": images,
        "timings_ms": {k: round(v, 3) for k, v in result.timings_ms.items()},
    }
    if result.error is not None:
        out["error"] = result.error
    if result.prompt_check is not None:
        out["prompt_check"] = _check(result.prompt_check)
    if result.source is not None:
        out["source"] = {"topic": result.source.topic, "partition": result.source.partition,
                         "offset": result.source.offset}
    return out


def encode_generation_result(result: GenerationResult) -> bytes:
    return msgpack.packb(generation_result_to_dict(result), use_bin_type=True)
