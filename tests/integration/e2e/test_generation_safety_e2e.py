"""Generation's moderation through the real broker, under both delivery guarantees: a blocked
prompt is answered ``blocked`` without the UNet running, and a blocked image is withheld (no
PNG, no blob; a v1 job is answered ``rejected`` saying so).

The worker runs the tiny random SD engines (torch fp32 on the CPU) with moderation's real
models: MiniLM for the prompt (a label whose description is the prompt scores ~1), open_nsfw
for the images under a policy whose block threshold is 0 (every image blocked). CLIP (the tiny
random checkpoint) compares each image with its prompt: under ``min_consistency = 1`` every
image goes to review, published with its verdict.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from engines.models import minilm
from tests.harness.faults import key_counts, read_all
from tests.harness.workers import Topics, committed, end_offsets, produce_records
from tests.integration.e2e.test_generation_e2e import (  # noqa: F401 - fixtures, used by name
    MISSING,
    engine_cache,
    job,
    results_for,
    serve,
    topics,
)
from tests.unit.tasks.moderation.clip.conftest import tiny_clip  # noqa: F401 - a fixture, used by name
from worker.wire.moderation_codec import decode_result

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(MISSING), reason=f"needs the gen extra ({', '.join(MISSING)} "
                                             "missing): pip install 'kafka-trt-worker[gen]'"),
    pytest.mark.skipif(not minilm.available(),
                       reason=f"needs {minilm.PACKAGE} ({minilm.EXTRA_HINT})"),
]

VIOLENT = "threatening to hurt or kill someone"
POLICIES = {
    "words": {"models": ["text"], "labels": {"violence": {
        "descriptions": [VIOLENT], "review": 0.5, "block": 0.9}}},
    "block_all": {"models": ["open_nsfw"], "labels": {"nsfw": {"review": 0.0, "block": 0.0}}},
}
CLIP_POLICIES = {
    # A consistency of 1 needs the image's embedding to be the prompt's: never, so every image
    # is sent to review by CLIP's rule (the tiny CLIP's labels never decide: thresholds 1).
    "consistent": {"models": ["open_nsfw", "clip"], "min_consistency": 1.0, "labels": {
        "nsfw": {"review": 1.0, "block": 1.0},
        "weapons": {"descriptions": ["gun"], "review": 1.0, "block": 1.0}}},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_blocked_prompt_skips_the_unet_and_a_blocked_image_is_withheld(
    kafka_bootstrap: str, topics: Topics, serve: Any, tmp_path: Path, guarantee: str  # noqa: F811
) -> None:
    overrides: dict[str, Any] = {"processing": {"guarantee": guarantee}}
    if guarantee == "exactly-once":
        overrides["kafka"] = {"instance_id": f"gen-safe-{uuid.uuid4().hex[:6]}"}
    worker = serve(generation={"moderation": {"policy": "block_all", "prompt_policy": "words"}},
                   moderation={"policies": POLICIES}, **overrides)
    unet = worker.worker.task.engines.runners["unet"]
    calls: list[int] = []
    infer = unet.infer

    def counted(feeds: Any, stream: Any = None) -> Any:
        calls.append(len(next(iter(feeds.values()))))
        return infer(feeds, stream)

    unet.infer = counted
    with worker:
        produce_records(kafka_bootstrap, topics.jobs, [job("bad", prompt=f"I am {VIOLENT}",
                                                           version=2)])
        bad = decode_result(results_for(kafka_bootstrap, topics.results, {"bad"})["bad"].value())
        assert calls == [], "the UNet never ran for the blocked prompt"
        produce_records(kafka_bootstrap, topics.jobs, [
            job("img", num_images=2, seed=9, version=2), job("img-v1", seed=9)])
        got = results_for(kafka_bootstrap, topics.results, {"img", "img-v1"})
        assert calls, "the passing prompts were drawn"
    assert (bad["v"], bad["status"], bad["images"]) == (2, "blocked", [])
    assert bad["prompt_check"]["verdict"] == "block"
    assert bad["prompt_check"]["rule"] == "block:text.violence"
    assert bad["prompt_check"]["scores"]["text.violence"] >= 0.9
    assert "denoise" not in bad["timings_ms"]
    img = decode_result(got["img"].value())
    assert img["status"] == "ok" and img["prompt_check"]["verdict"] == "allow"
    assert [im["seed"] for im in img["images"]] == [9, 10]
    for im in img["images"]:
        assert "png" not in im and "blob" not in im, "a blocked image is never published"
        assert (im["verdict"], im["rule"]) == ("block", "block:open_nsfw.nsfw")
        assert set(im["scores"]) == {"open_nsfw.nsfw", "open_nsfw.sfw"}
    v1 = decode_result(got["img-v1"].value())
    assert (v1["v"], v1["status"], v1["images"]) == (1, "rejected", [])
    assert "withheld by moderation" in v1["error"] and "prompt_check" not in v1
    assert not (tmp_path / "blobs").exists(), "nothing written to the blob store"
    assert key_counts(read_all(kafka_bootstrap, topics.results, idle_s=1)) == {
        "bad": 1, "img": 1, "img-v1": 1}
    assert read_all(kafka_bootstrap, topics.dlq, idle_s=0.5) == []
    if guarantee == "exactly-once":
        raw = read_all(kafka_bootstrap, topics.results, isolation="read_uncommitted", idle_s=0.5)
        assert key_counts(raw) == {"bad": 1, "img": 1, "img-v1": 1}
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)


@pytest.mark.timeout(240)
def test_clip_sends_an_image_that_does_not_show_its_prompt_to_review(
    kafka_bootstrap: str, topics: Topics, serve: Any, tiny_clip: Path  # noqa: F811
) -> None:
    worker = serve(generation={"moderation": {"policy": "consistent"}},
                   moderation={"policies": POLICIES | CLIP_POLICIES,
                               "clip": {"weights_dir": str(tiny_clip)}})
    with worker:
        produce_records(kafka_bootstrap, topics.jobs, [job("c", num_images=2, seed=9,
                                                           version=2)])
        got = results_for(kafka_bootstrap, topics.results, {"c"})
    r = decode_result(got["c"].value())
    assert r["status"] == "ok" and "prompt_check" not in r
    assert [im["seed"] for im in r["images"]] == [9, 10]
    for im in r["images"]:
        assert im["png"], "a review image is published"
        assert (im["verdict"], im["rule"]) == ("review", "review:clip.consistency")
        assert set(im["scores"]) == {"open_nsfw.nsfw", "open_nsfw.sfw", "clip.weapons",
                                     "clip.neutral", "clip.consistency"}
        assert 0.0 <= im["scores"]["clip.consistency"] < 1.0
    assert read_all(kafka_bootstrap, topics.dlq, idle_s=0.5) == []
    assert committed(kafka_bootstrap, topics.group, topics.jobs, 2) == end_offsets(
        kafka_bootstrap, topics.jobs, 2)
