"""The generation wire contract: schemas/generation-*.json, their examples and the codec agree.

Same rules as tests/unit/wire/test_schemas.py for moderation, in both contract versions:
examples valid on the msgpack side, job examples decode, result examples are reproduced by the
codec, mutated jobs are refused by both the schema and the codec, and the codec never accepts
what the schema refuses.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.exceptions import JobRejected, MalformedPayload, SchemaViolation, UnsupportedVersion
from worker.tasks.generation.schedulers import SCHEDULERS
from worker.wire import generation_codec as codec
from worker.wire.generation_codec import (
    decode_generation_job,
    default_seed,
    generation_result_to_dict,
)
from worker.wire.generation_jobs import (
    GENERATION_RESULT_SCHEMAS,
    BlobRef,
    Check,
    GeneratedImage,
    GenerationJob,
    GenerationResult,
)
from worker.wire.moderation_jobs import Status, Verdict
from worker.wire.records import SourceRef

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"
EXAMPLES = sorted((SCHEMAS / "examples").glob("generation-*.json"))
JOBS = [p for p in EXAMPLES if p.name.startswith("generation-job.")]
RESULTS = [p for p in EXAMPLES if p.name.startswith("generation-result.")]
HASHES = {"text_encoder": "t", "unet": "u", "vae": "v"}
JOB = {1: "generation-job", 2: "generation-job.v2"}
RESULT = {1: "generation-result", 2: "generation-result.v2"}


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_both_generation_schemas_have_examples_in_both_versions(contract: Any) -> None:
    assert {*JOB.values(), *RESULT.values()} <= set(contract.names)
    assert len(JOBS) >= 3 and len(RESULTS) >= 4
    assert {contract.name_for_example(p) for p in EXAMPLES} == {*JOB.values(), *RESULT.values()}


@pytest.mark.parametrize("version", [1, 2])
def test_codec_constants_mirror_the_job_schema(contract: Any, version: int) -> None:
    props = contract.schema(JOB[version])["properties"]
    assert props["v"]["const"] == version
    assert set(props) == codec.GENERATION_JOB_FIELDS
    assert props["prompt"]["maxLength"] == codec.MAX_PROMPT_CHARS
    assert props["prompt"]["pattern"] == codec.PROMPT_PRESENT.pattern
    assert props["negative_prompt"]["maxLength"] == codec.MAX_PROMPT_CHARS
    for side in ("width", "height"):
        assert (props[side]["minimum"], props[side]["maximum"], props[side]["multipleOf"]) == (
            codec.MIN_SIDE, codec.MAX_SIDE, codec.SIDE_MULTIPLE)
    assert props["steps"]["maximum"] == codec.MAX_STEPS
    assert props["guidance_scale"]["maximum"] == codec.MAX_GUIDANCE
    assert props["seed"]["maximum"] == codec.MAX_SEED
    assert props["num_images"]["maximum"] == codec.MAX_IMAGES
    assert [s for s in props["scheduler"]["enum"] if s] == list(SCHEDULERS)


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_is_valid_on_the_msgpack_side(contract: Any, path: Path) -> None:
    name = contract.name_for_example(path)
    assert contract.errors(name, contract.to_wire(name, _load(path))) == []


@pytest.mark.parametrize("path", JOBS, ids=_ids(JOBS))
def test_job_example_decodes_with_the_codec(contract: Any, path: Path) -> None:
    wire = contract.to_wire(contract.name_for_example(path), _load(path))
    job = decode_generation_job(msgpack.packb(wire, use_bin_type=True))
    d = GenerationJob(id="", prompt="")
    assert job == GenerationJob(
        id=wire["id"], prompt=wire["prompt"], negative_prompt=wire.get("negative_prompt") or "",
        width=wire.get("width", d.width), height=wire.get("height", d.height),
        steps=wire.get("steps", d.steps), guidance_scale=wire.get("guidance_scale", 7.5),
        scheduler=wire.get("scheduler", "ddim"), seed=wire.get("seed", default_seed(wire["id"])),
        num_images=wire.get("num_images", 1), deadline_ms=wire.get("deadline_ms"),
        schema_version=wire["v"])


def _check(doc: dict[str, Any]) -> Check | None:
    return Check(Verdict(doc["verdict"]), doc["rule"], doc["scores"]) if "verdict" in doc \
        else None


def _result_from_example(doc: dict[str, Any]) -> GenerationResult:
    images = []
    for im in doc["images"]:
        blob = BlobRef(**im["blob"]) if "blob" in im else None
        png = base64.b64decode(im["png"]) if "png" in im else None
        quarantine = BlobRef(**im["quarantine"]) if "quarantine" in im else None
        images.append(GeneratedImage(im["index"], im["seed"], im["width"], im["height"], png, blob,
                                     _check(im), quarantine))
    src = doc.get("source")
    return GenerationResult(
        id=doc["id"], status=Status(doc["status"]), model_id=doc["model_id"],
        engine_hashes=doc["engine_hashes"], random_weights=doc["random_weights"],
        images=tuple(images), timings_ms=doc["timings_ms"], error=doc.get("error"),
        source=SourceRef(**src) if src else None, schema_version=doc["v"],
        prompt_check=_check(doc.get("prompt_check", {})))


@pytest.mark.parametrize("path", RESULTS, ids=_ids(RESULTS))
def test_result_to_dict_reproduces_the_result_example(contract: Any, path: Path) -> None:
    doc = _load(path)
    wire = contract.to_wire(contract.name_for_example(path), doc)
    assert generation_result_to_dict(_result_from_example(doc)) == wire


def test_inline_png_example_is_a_png_of_the_stated_size(contract: Any) -> None:
    import io

    from PIL import Image

    doc = contract.to_wire("generation-result", _load(SCHEMAS / "examples" /
                                                      "generation-result.ok.json"))
    for im in doc["images"]:
        with Image.open(io.BytesIO(im["png"])) as img:
            assert (img.format, img.size) == ("PNG", (im["width"], im["height"]))


def _image(**kw: Any) -> GeneratedImage:
    return GeneratedImage(**({"index": 0, "seed": 1, "width": 64, "height": 64} | kw))


@pytest.mark.parametrize(
    ("status", "images", "valid"),
    [
        (Status.OK, (_image(png=b"\x89PNG\r\n\x1a\n"),), True),
        (Status.OK, (), False),  # ok needs images
        (Status.ERROR, (), True),
        (Status.EXPIRED, (_image(png=b"\x89PNG\r\n\x1a\n"),), False),  # only ok has images
        (Status.OK, (_image(blob=BlobRef("file:///b/0.png", "0" * 64, 10)),), True),
        (Status.OK, (_image(blob=BlobRef("file:///b/0.png", "XYZ", 10)),), False),
        (Status.OK, (_image(png=b"\x89PNG\r\n\x1a\n", seed=2**32),), False),
        (Status.OK, (_image(png=b"GIF89a\x01\x00"),), False),  # not a PNG
        (Status.OK, (_image(png=b"\x89PNG\r\n\x1a"),), False),  # a signature cut short
    ],
    ids=["ok-inline", "ok-empty", "error-empty", "expired-with-image", "ok-blob",
         "ok-blob-bad-sha", "ok-seed-2**32", "ok-gif", "ok-7-bytes"],
)
@pytest.mark.parametrize("version", [1, 2])
def test_result_schema_rules(contract: Any, status: Status, images: Any, valid: bool,
                             version: int) -> None:
    result = GenerationResult("j", status, "m", HASHES, True, images, {"total": 1.0},
                              schema_version=version)
    doc = generation_result_to_dict(result)
    assert doc["v"] == version
    assert (contract.errors(RESULT[version], doc) == []) is valid


@pytest.mark.parametrize("version", [1, 2])
def test_result_header_names_the_results_version(version: int) -> None:
    assert GENERATION_RESULT_SCHEMAS[version] == f"generation-result/v{version}"


PNG = b"\x89PNG\r\n\x1a\n"
BLOCK = Check(Verdict.BLOCK, "block:open_nsfw.nsfw", {"open_nsfw.nsfw": 0.9, "open_nsfw.sfw": 0.1})
REVIEW = Check(Verdict.REVIEW, "review:open_nsfw.nsfw", {"open_nsfw.nsfw": 0.5})
ALLOW = Check(Verdict.ALLOW, "allow", {"open_nsfw.nsfw": 0.01})
QUARANTINE = BlobRef("s3://q/a.png", "0" * 64, 10)


@pytest.mark.parametrize(
    ("status", "images", "prompt", "valid"),
    [
        (Status.OK, (_image(png=PNG, check=ALLOW), _image(index=1, check=BLOCK)), ALLOW, True),
        (Status.OK, (_image(check=BLOCK, quarantine=QUARANTINE),), None, True),  # all withheld
        (Status.OK, (_image(png=PNG, check=REVIEW),), None, True),
        (Status.OK, (_image(blob=QUARANTINE, check=REVIEW),), None, True),
        (Status.OK, (_image(png=PNG, check=BLOCK),), None, False),  # a blocked image published
        (Status.OK, (_image(blob=QUARANTINE, check=BLOCK),), None, False),
        (Status.OK, (_image(check=REVIEW),), None, False),  # only a block has no png
        (Status.OK, (_image(png=PNG, check=ALLOW, quarantine=QUARANTINE),), None, False),
        (Status.OK, (_image(png=PNG, check=Check(Verdict.BLOCK, "allow", {})),), None, False),
        (Status.OK, (_image(png=PNG, check=Check(Verdict.ALLOW, "allow", {"x.y": 1.5})),), None,
         False),  # a score outside [0, 1]
        (Status.BLOCKED, (), BLOCK, True),
        (Status.BLOCKED, (), None, False),  # blocked says what blocked it
        (Status.BLOCKED, (), ALLOW, False),
        (Status.BLOCKED, (_image(png=PNG),), BLOCK, False),  # nothing generated
    ],
    ids=["mixed", "all-withheld-quarantined", "review", "review-blob", "block-with-png",
         "block-with-blob", "review-without-png", "quarantine-on-allow", "verdict-rule-disagree",
         "score-over-1", "blocked", "blocked-no-check", "blocked-allow", "blocked-with-image"],
)
def test_v2_moderation_rules(contract: Any, status: Status, images: Any, prompt: Check | None,
                             valid: bool) -> None:
    doc = generation_result_to_dict(GenerationResult("j", status, "m", HASHES, True, images,
                                                     {"total": 1.0}, schema_version=2,
                                                     prompt_check=prompt))
    assert (contract.errors("generation-result.v2", doc) == []) is valid
    # v1 has none of these fields and no status blocked: the task never writes them there
    assert contract.errors("generation-result", doc | {"v": 1}) != []


def test_an_image_with_both_png_and_blob_is_refused(contract: Any) -> None:
    im = _image(png=b"\x89PNG\r\n\x1a\n", blob=BlobRef("file:///b", "0" * 64, 1))
    doc = generation_result_to_dict(GenerationResult("j", Status.OK, "m", HASHES, False, (im,)))
    doc["images"][0]["png"] = im.png  # the codec writes one form; the schema refuses both
    assert contract.errors("generation-result", doc) != []


# --- mutated jobs: refused by schema and codec --------------------------------------------------


def _full(version: int) -> dict[str, Any]:
    doc: dict[str, Any] = _load(SCHEMAS / "examples" / "generation-job.full.json")
    return {**doc, "v": version}


def _drop(key: str) -> Callable[[dict[str, Any]], Any]:
    return lambda d: {k: v for k, v in d.items() if k != key}


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda d: {**d, key: value}


MUTATIONS: list[tuple[str, Callable[[dict[str, Any]], Any], type[JobRejected]]] = [
    ("drop-v", _drop("v"), SchemaViolation),
    ("drop-id", _drop("id"), SchemaViolation),
    ("drop-prompt", _drop("prompt"), SchemaViolation),
    ("v=3", _set("v", 3), UnsupportedVersion),
    ("v=2.0", _set("v", 2.0), SchemaViolation),
    ("steps=25.0", _set("steps", 25.0), SchemaViolation),
    ('prompt=""', _set("prompt", ""), SchemaViolation),
    ("prompt-whitespace", _set("prompt", " \t\n "), SchemaViolation),
    ("prompt-nbsp-ideographic", _set("prompt", "\u00a0\u3000"), SchemaViolation),
    ("prompt-bom", _set("prompt", "\ufeff"), SchemaViolation),  # ECMA-262 whitespace
    ("prompt-2001", _set("prompt", "p" * 2001), SchemaViolation),
    ("prompt-as-bin", _set("prompt", b"a cat"), SchemaViolation),
    ("negative-as-int", _set("negative_prompt", 3), SchemaViolation),
    ("scheduler=pndm", _set("scheduler", "pndm"), SchemaViolation),
    ('scheduler="DDIM"', _set("scheduler", "DDIM"), SchemaViolation),
    ("width=500", _set("width", 500), SchemaViolation),
    ("width=56", _set("width", 56), SchemaViolation),
    ("height=4096", _set("height", 4096), SchemaViolation),
    ('width="512"', _set("width", "512"), SchemaViolation),
    ("steps=0", _set("steps", 0), SchemaViolation),
    ("steps=151", _set("steps", 151), SchemaViolation),
    ("steps=true", _set("steps", True), SchemaViolation),
    ("guidance=-1", _set("guidance_scale", -1), SchemaViolation),
    ("guidance=31", _set("guidance_scale", 31.0), SchemaViolation),
    ('guidance="7"', _set("guidance_scale", "7"), SchemaViolation),
    ("guidance=true", _set("guidance_scale", True), SchemaViolation),
    ("seed=-1", _set("seed", -1), SchemaViolation),
    ("seed=2**32", _set("seed", 2**32), SchemaViolation),
    ("num_images=0", _set("num_images", 0), SchemaViolation),
    ("num_images=65", _set("num_images", 65), SchemaViolation),
    ("deadline=-1", _set("deadline_ms", -1), SchemaViolation),
    ("unknown-field", _set("sampler", "ddim"), SchemaViolation),
    ("top-level-list", lambda d: list(d.values()), MalformedPayload),
]


@pytest.mark.parametrize("version", [1, 2])
def test_the_unmutated_base_is_accepted_by_both(contract: Any, version: int) -> None:
    doc = _full(version)
    assert contract.errors(JOB[version], doc) == []
    assert contract.errors(JOB[3 - version], doc) != []
    job = decode_generation_job(msgpack.packb(doc, use_bin_type=True))
    assert job.schema_version == version


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("mutate", "expected"), [m[1:] for m in MUTATIONS],
                         ids=[m[0] for m in MUTATIONS])
def test_mutated_job_is_rejected_by_schema_and_codec(
    contract: Any, mutate: Callable[[dict[str, Any]], Any], expected: type[JobRejected],
    version: int
) -> None:
    doc = mutate(_full(version))
    assert contract.errors(JOB[version], doc) != [], "schema accepted the mutation"
    with pytest.raises(JobRejected) as info:
        decode_generation_job(msgpack.packb(doc, use_bin_type=True))
    assert type(info.value) is expected


@pytest.mark.parametrize("prompt", ["\x1c", "\x85", "\u200b"], ids=["U+001C", "U+0085", "U+200B"])
def test_a_prompt_outside_ecma_whitespace_is_accepted_by_both(contract: Any, prompt: str
                                                               ) -> None:
    """Python's str.strip() removes U+001C and U+0085; ECMA-262's \\s (the schema's) does not."""
    doc = {"v": 2, "id": "w", "prompt": prompt}
    assert contract.errors(JOB[2], doc) == []
    assert decode_generation_job(msgpack.packb(doc)).prompt == prompt


def test_a_duplicate_key_is_refused() -> None:
    pairs = [("v", 2), ("id", "a"), ("prompt", "a cat"), ("prompt", "a dog")]
    payload = bytes([0x80 | len(pairs)]) + b"".join(msgpack.packb(k) + msgpack.packb(v)
                                                    for k, v in pairs)
    with pytest.raises(SchemaViolation, match=r"duplicate key.*'prompt'"):
        decode_generation_job(payload)


def test_null_optional_fields_take_the_defaults(contract: Any) -> None:
    doc = {"v": 1, "id": "n", "prompt": "p", **{k: None for k in codec.GENERATION_JOB_FIELDS - {
        "v", "id", "prompt"}}}
    assert contract.errors("generation-job", doc) == []
    job = decode_generation_job(msgpack.packb(doc))
    assert job == GenerationJob(id="n", prompt="p", seed=default_seed("n"))


def test_default_seed_is_stable_per_id_and_in_range() -> None:
    assert default_seed("job-1") == default_seed("job-1") != default_seed("job-2")
    assert 0 <= default_seed("x" * 256) <= codec.MAX_SEED


def test_image_seeds_wrap_modulo_2_32() -> None:
    job = GenerationJob(id="j", prompt="p", seed=2**32 - 2, num_images=4)
    assert [job.image_seed(i) for i in range(4)] == [2**32 - 2, 2**32 - 1, 0, 1]


# --- property: whatever the codec accepts, the schema accepts -----------------------------------

_ANY = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                 st.floats(allow_nan=False), st.text(max_size=12), st.binary(max_size=8))
_PLAUSIBLE = {
    "v": st.sampled_from([1, 2]),
    "id": st.text(min_size=1, max_size=300),
    "prompt": st.one_of(st.text(max_size=40),
                        st.text(alphabet=" \t\x1c\x85\u00a0\ufeffx", max_size=4)),  # blank-ish
    "negative_prompt": st.one_of(st.none(), st.text(max_size=20)),
    "width": st.one_of(st.none(), st.integers(0, 2200)),
    "height": st.one_of(st.none(), st.sampled_from([64, 512, 768, 2048, 2056, 63])),
    "steps": st.one_of(st.none(), st.integers(-1, 160)),
    "guidance_scale": st.one_of(st.none(), st.floats(-1, 35), st.integers(-1, 35)),
    "scheduler": st.one_of(st.none(), st.sampled_from([*SCHEDULERS, "Euler", "lms"])),
    "seed": st.one_of(st.none(), st.integers(-2, 2**32 + 2)),
    "num_images": st.one_of(st.none(), st.integers(-1, 70)),
    "deadline_ms": st.one_of(st.none(), st.integers(-5, 2**63 + 5)),
}


@st.composite
def _near_jobs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, plausible in _PLAUSIBLE.items():
        mode = draw(st.sampled_from(("absent", "any", *["plausible"] * 8)))
        if mode != "absent":
            doc[key] = draw(plausible if mode == "plausible" else _ANY)
    return doc


@settings(max_examples=300, deadline=None, database=None)
@given(doc=_near_jobs())
def test_codec_never_accepts_a_job_the_schema_refuses(contract: Any, doc: Any) -> None:
    try:
        job = decode_generation_job(msgpack.packb(doc, use_bin_type=True))
    except JobRejected:
        return
    assert contract.errors(JOB[job.schema_version], doc) == []
