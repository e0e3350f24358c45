"""Generation's prompt check and image moderation on the tiny SD engines (torch fp32 on the CPU)
with moderation's own models: the real MiniLM text model, open_nsfw (onnxruntime) and the tiny
random CLIP (prompt-image consistency), built through moderation's registry from moderation's
policies."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from gen_support import needs_sd, settings
from PIL import Image

from engines.backends.base import InferHandle, Runner
from engines.models import minilm
from engines.models.sd.engines import SdEngines
from tests.unit.tasks.moderation.clip.conftest import tiny_clip  # noqa: F401 - a fixture, used by name
from worker.config import WorkerConfig, load_config
from worker.exceptions import ConfigError
from worker.tasks.batcher import Batch
from worker.tasks.generation.blobs import LocalBlobStore
from worker.tasks.generation.safety import Safety, make_safety, resolve
from worker.tasks.generation.task import GenerationTask
from worker.wire.generation_codec import generation_result_to_dict
from worker.wire.generation_jobs import GenerationResult
from worker.wire.moderation_jobs import Status, Verdict
from worker.wire.records import SourceRef

pytestmark = [needs_sd, pytest.mark.skipif(not minilm.available(),
                                           reason=f"needs {minilm.PACKAGE} ({minilm.EXTRA_HINT})")]

VIOLENT = "threatening to hurt or kill someone"  # the label's own description: scores ~1
VIOLENCE = {"descriptions": [VIOLENT], "review": 0.5, "block": 0.9}


def nsfw(review: float, block: float) -> dict[str, Any]:
    return {"models": ["open_nsfw"], "labels": {"nsfw": {"review": review, "block": block}}}


POLICIES = {
    "words": {"models": ["text"], "labels": {"violence": VIOLENCE}},
    "all_words": {"models": ["text"], "labels": {"violence": VIOLENCE | {"review": 0.0,
                                                                         "block": 0.0}}},
    "block_all": nsfw(0.0, 0.0),  # every image blocked: nsfw >= 0 always
    "review_all": nsfw(0.0, 1.0),
    "pass_all": nsfw(1.0, 1.0),
    "both": {"models": ["open_nsfw", "text"], "labels": {
        "violence": VIOLENCE, "nsfw": {"review": 1.0, "block": 1.0}}},
}


def config(tmp: Path, **moderation: Any) -> WorkerConfig:
    return load_config(engines={"cache_dir": str(tmp)}, model={"intra_op_threads": 1},
                       moderation={"policies": POLICIES},
                       generation={"random_weights": "tiny", "device": "cpu",
                                   **moderation})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("safety-engines")


@pytest.fixture(scope="module")
def safety(cache_dir: Path) -> Iterator[Safety]:
    """Every model the policies above run, built once through moderation's registry; each
    test picks its policies by name (a view on the same models)."""
    from worker.tasks.moderation.models import make_models
    from worker.tasks.moderation.served_policies import effective_policies

    cfg = config(cache_dir)
    policies = effective_policies(cfg)
    s = Safety(make_models(cfg, policies), None, None, policies)
    s.warm_up()  # what GenerationTask.warm_up does before the first batch
    yield s
    s.close()


class Counting(Runner):
    """The UNet, counting its calls."""

    def __init__(self, inner: Runner) -> None:
        super().__init__()
        self.inner, self.calls = inner, 0
        self.backend = inner.backend

    def _activate(self) -> None:
        """Nothing of its own: the wrapped UNet is activated by the session's fixture."""

    def _deactivate(self) -> None:
        """Nothing of its own: the fixture deactivates the wrapped UNet."""

    def _infer(self, feeds: Any, stream: Any) -> InferHandle:
        self.calls += 1
        return self.inner.infer(feeds, stream)


def task_with(engines: SdEngines, safety: Safety, tmp: Path, *, image: str | None,
              prompt: str | None, quarantine: bool = False, **overrides: Any
              ) -> GenerationTask:
    unet = Counting(engines.runners["unet"])
    unet.activate()
    counted = replace(engines, runners={**engines.runners, "unet": unet})
    view = Safety(safety.models, image, prompt, safety.policies, own_models=False)
    return GenerationTask(settings(**overrides), counted, LocalBlobStore(tmp / "blobs"),
                          own_engines=False, safety=view,
                          quarantine=LocalBlobStore(tmp / "quarantine") if quarantine else None)


def payload(**kw: Any) -> bytes:
    doc = {"v": 2, "id": "job-1", "prompt": "a red car", "width": 64, "height": 64, "steps": 3,
           "seed": 42} | kw
    return msgpack.packb(doc, use_bin_type=True)


def run(task: GenerationTask, *payloads: bytes) -> list[GenerationResult]:
    items = [task.pending(p, SourceRef("generation.jobs", 0, i)) for i, p in enumerate(payloads)]
    outcomes = task.submit(Batch(task.batcher_profiles()[0], items, len(items))).result(120)
    results = [o.result for o in outcomes]
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def unet_calls(task: GenerationTask) -> int:
    runner: Any = task.engines.runners["unet"]
    return int(runner.calls)


def valid(contract: Any, r: GenerationResult) -> None:
    name = "generation-result" if r.schema_version == 1 else "generation-result.v2"
    assert contract.errors(name, generation_result_to_dict(r)) == []


def rgb(png: bytes | None) -> np.ndarray:
    assert png is not None
    with Image.open(io.BytesIO(png)) as im:
        return np.asarray(im.convert("RGB"))


# -- configuration ---------------------------------------------------------------------------


def test_settings_name_moderation_policies_and_refuse_what_cannot_work(tmp_path: Path) -> None:
    assert resolve(config(tmp_path))[:2] == (None, None)  # off by default
    image, prompt, policies = resolve(config(tmp_path, moderation={"policy": "both"}))
    assert (image, prompt, set(policies)) == ("both", "both", {"both"})
    # auto: an image-only policy has no text model, so no prompt check
    assert resolve(config(tmp_path, moderation={"policy": "pass_all"}))[:2] == ("pass_all", None)
    assert resolve(config(tmp_path, moderation={"policy": "pass_all", "prompt_policy": "words"})
                   )[:2] == ("pass_all", "words")
    assert resolve(config(tmp_path, moderation={"policy": "both"}, prompt_check="off")
                   )[:2] == ("both", None)
    assert resolve(config(tmp_path, moderation={"prompt_policy": "words"}))[:2] == (None, "words")
    # model.policies (open_nsfw's thresholds) are moderation policies too
    assert resolve(config(tmp_path, moderation={"policy": "default"}))[0] == "default"
    with pytest.raises(ConfigError, match="'nope' is not a configured moderation policy"):
        resolve(config(tmp_path, moderation={"policy": "nope"}))
    with pytest.raises(ConfigError, match="runs no model that scores images"):
        resolve(config(tmp_path, moderation={"policy": "words"}))
    with pytest.raises(ConfigError, match="prompt_check = 'on' but"):
        resolve(config(tmp_path, moderation={"policy": "pass_all"}, prompt_check="on"))
    with pytest.raises(ConfigError, match="needs a prompt policy"):
        resolve(config(tmp_path, prompt_check="on"))


def test_models_come_from_moderation_s_registry(tmp_path: Path, cache_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.tasks.moderation import models

    assert make_safety(config(cache_dir)) is None  # off: nothing is built
    built: list[str] = []
    real = models.model_class

    def spy(name: str) -> Any:
        built.append(name)
        return real(name)

    monkeypatch.setattr(models, "model_class", spy)
    s = make_safety(config(cache_dir, moderation={"policy": "pass_all"}))
    assert s is not None
    try:
        assert (s.image_policy, s.prompt_policy) == ("pass_all", None)
        assert list(s.models) == ["open_nsfw"] == s.image_models and "open_nsfw" in built
    finally:
        s.close()


# -- item 1: the prompt ----------------------------------------------------------------------


def test_a_blocked_prompt_is_answered_blocked_without_running_the_unet(
        torch_engines: SdEngines, safety: Safety, tmp_path: Path, contract: Any) -> None:
    task = task_with(torch_engines, safety, tmp_path, image=None, prompt="words")
    try:
        (blocked,) = run(task, payload(id="bad", prompt=f"I am {VIOLENT}"))
        assert unet_calls(task) == 0, "nothing generated for a blocked prompt"
        (v1,) = run(task, payload(id="bad-v1", v=1, negative_prompt=VIOLENT))
        assert unet_calls(task) == 0, "the negative prompt is checked too"
        ok, late = run(task, payload(id="fine"), payload(id="bad2", prompt=VIOLENT))
        assert unet_calls(task) > 0
    finally:
        task.close()
    assert blocked.status is Status.BLOCKED and blocked.images == ()
    check = blocked.prompt_check
    assert check is not None and check.verdict is Verdict.BLOCK
    assert check.rule == "block:text.violence" and check.scores["text.violence"] >= 0.9
    assert set(blocked.timings_ms) == {"queue", "prompt_check", "total"}
    doc = generation_result_to_dict(blocked)
    assert doc["status"] == "blocked" and doc["prompt_check"]["rule"] == "block:text.violence"
    valid(contract, blocked)
    # v1: no status blocked, no prompt_check: rejected, the rule in error
    assert v1.status is Status.REJECTED and v1.prompt_check is None and v1.images == ()
    assert "block:text.violence" in (v1.error or "")
    valid(contract, v1)
    # In one batch, the passing job is drawn and the blocked one is not.
    assert ok.status is Status.OK and len(ok.images) == 1 and ok.images[0].png
    assert ok.prompt_check is not None and ok.prompt_check.verdict is Verdict.ALLOW
    assert ok.prompt_check.scores["text.violence"] < 0.5
    assert late.status is Status.BLOCKED
    valid(contract, ok)


def test_prompt_scores_are_the_text_model_s_for_a_moderation_job(safety: Safety) -> None:
    """The same chunking, embedding and calibration as a moderation job's text."""
    from worker.tasks.moderation.models.text.model import TextModel

    text = safety.models["text"]
    assert isinstance(text, TextModel)
    prompt, negative = "a red car on a coastal road", VIOLENT
    (both,) = text.score_texts("words", [[prompt, negative]])
    alone = [text.score_texts("words", [[t]])[0]["violence"] for t in (prompt, negative)]
    assert alone[0] < 0.5 < 0.9 < alone[1]
    assert both["violence"] == pytest.approx(max(alone), abs=1e-6)
    # a moderation job's text goes through the same bank: the label's calibrated best cosine
    chunks = text.engine.tokenizer.chunks(negative)
    from worker.tasks.moderation.models.text.scoring import embed_chunks

    emb = embed_chunks(text.engine.runner, text.engine.tokenizer, chunks, text.engine.max_batch)
    assert text.scores("words", dict(enumerate(emb)))["violence"] == pytest.approx(alone[1])


# -- item 2: the images ----------------------------------------------------------------------


def test_a_blocked_image_is_never_published(torch_engines: SdEngines, safety: Safety,
                                            tmp_path: Path, contract: Any) -> None:
    # results_max_bytes at its minimum: a published image would go to the blob store
    task = task_with(torch_engines, safety, tmp_path, image="block_all", prompt=None,
                     results_max_bytes=4096)
    try:
        v2, v1 = run(task, payload(id="a", num_images=2), payload(id="b", v=1))
    finally:
        task.close()
    assert v2.status is Status.OK and len(v2.images) == 2
    for im in v2.images:
        assert im.png is None and im.blob is None and im.quarantine is None
        assert im.check is not None and im.check.verdict is Verdict.BLOCK
        assert im.check.rule == "block:open_nsfw.nsfw"
        assert set(im.check.scores) == {"open_nsfw.nsfw", "open_nsfw.sfw"}
    doc = generation_result_to_dict(v2)
    assert all({"png", "blob"}.isdisjoint(im) for im in doc["images"])
    assert [im["seed"] for im in doc["images"]] == [42, 43]
    assert "moderation" in v2.timings_ms
    valid(contract, v2)
    assert not (tmp_path / "blobs").exists(), "no blob written for a blocked image"
    # v1: the image withheld, said in error; nothing left to show: rejected
    assert v1.status is Status.REJECTED and v1.images == ()
    assert "withheld by moderation: block:open_nsfw.nsfw" in (v1.error or "")
    valid(contract, v1)


def test_a_quarantine_keeps_the_blocked_png_out_of_the_result(
        torch_engines: SdEngines, safety: Safety, tmp_path: Path, contract: Any) -> None:
    task = task_with(torch_engines, safety, tmp_path, image="block_all", prompt=None,
                     quarantine=True)
    try:
        (r,) = run(task, payload(id="q"))
    finally:
        task.close()
    (im,) = r.images
    assert im.png is None and im.blob is None and im.quarantine is not None
    path = Path(im.quarantine.uri.removeprefix("file://"))
    assert path.is_relative_to(tmp_path / "quarantine") and rgb(path.read_bytes()).shape == (
        64, 64, 3)
    assert not (tmp_path / "blobs").exists()
    valid(contract, r)


def test_review_images_are_published_with_their_verdict_and_v1_is_unchanged(
        torch_engines: SdEngines, safety: Safety, tmp_path: Path, contract: Any) -> None:
    task = task_with(torch_engines, safety, tmp_path, image="review_all", prompt=None)
    plain = task_with(torch_engines, safety, tmp_path, image=None, prompt=None)
    try:
        v2, v1 = run(task, payload(id="r"), payload(id="r1", v=1))
        _, before = run(plain, payload(id="r"), payload(id="r1", v=1))  # the same batch shape
    finally:
        task.close()
        plain.close()
    (im,) = v2.images
    assert im.check is not None and im.check.verdict is Verdict.REVIEW and im.png
    assert im.check.rule == "review:open_nsfw.nsfw"
    valid(contract, v2)
    assert v1.error is None and v1.images[0].check is None
    assert generation_result_to_dict(v1)["images"] == generation_result_to_dict(before)["images"]
    valid(contract, v1)


def test_an_image_is_scored_on_the_pixels_it_is_published_with(
        torch_engines: SdEngines, safety: Safety, tmp_path: Path) -> None:
    import torch

    task = task_with(torch_engines, safety, tmp_path, image="pass_all", prompt=None)
    try:
        (r,) = run(task, payload(num_images=2, scheduler="euler"))
    finally:
        task.close()
    model = safety.models["open_nsfw"]
    for im in r.images:
        assert im.check is not None and im.check.verdict is Verdict.ALLOW
        px = torch.from_numpy(rgb(im.png)[None].copy())
        (again,) = model.score_pixels("pass_all", px, ["a red car"])
        assert {f"open_nsfw.{k}": v for k, v in again.items()} == im.check.scores


def test_the_cpu_path_gives_the_device_path_s_pixels_and_verdicts(safety: Safety) -> None:
    """On the same pixels: the generated-image preprocessing (run here on CPU tensors, on CUDA
    where the VAE's output lives) gives moderation's GPU preprocessing rows exactly, and
    moderation's CPU path (Pillow's resize) scores within the existing tolerance, with the same
    verdicts under every policy."""
    import torch

    from worker.tasks.generation.safety import decide
    from worker.tasks.moderation.images.cpu import decode_image
    from worker.tasks.moderation.models.open_nsfw.gpu_preprocess import (
        crop_generated,
        prepare_batch,
    )
    from worker.tasks.moderation.models.open_nsfw.preprocess import crop_pixels, normalize_pixels

    rng = np.random.default_rng(5)
    smooth = np.kron(rng.integers(0, 256, (2, 8, 8, 3)), np.ones((1, 8, 8, 1))).astype(np.uint8)
    noisy = rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    images = np.concatenate([smooth, noisy])
    pngs = []
    for px in images:
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, "PNG")
        pngs.append(buf.getvalue())
    rows = crop_generated(torch.from_numpy(images))
    gpu_rows = torch.zeros((len(pngs), 224, 224, 3), dtype=torch.uint8)
    assert prepare_batch(pngs, gpu_rows) == [None] * len(pngs)
    assert torch.equal(rows, gpu_rows), "the moderation GPU path's geometry, bit for bit"
    model: Any = safety.models["open_nsfw"]
    ours = model.score_pixels("pass_all", torch.from_numpy(images), ["x"] * len(images))
    pillow = [normalize_pixels(crop_pixels(decode_image(p), jpeg_roundtrip=False)) for p in pngs]
    ref = model._infer_chunks(pillow, model._profiles[0])
    for mine, row in zip(ours, ref, strict=True):
        theirs = model.named(row)
        assert abs(mine["nsfw"] - theirs["nsfw"]) < 3e-2  # the GPU/CPU preprocessing bound
        for name in ("default", "block_all", "review_all", "pass_all"):
            policy = safety.policies[name]
            a = decide(policy, {"open_nsfw": mine})
            b = decide(policy, {"open_nsfw": theirs})
            assert (a.verdict, a.rule) == (b.verdict, b.rule)


def test_an_image_policy_with_a_model_that_cannot_score_generated_images_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that neither scores pixels nor texts (a plug-in without ``score_pixels``; CLIP
    made so here) would be left out of every image's verdict without a word."""
    from worker.tasks.moderation.models.clip.model import ClipModel

    monkeypatch.setattr(ClipModel, "scores_pixels", False)
    with pytest.raises(ConfigError, match="runs clip, which cannot score generated images"):
        resolve(clip_config(tmp_path, "with_clip"))


# -- CLIP: prompt-image consistency ----------------------------------------------------------

# The tiny random CLIP's labels never decide here (thresholds 1.0): consistency does.
WEAPONS = {"descriptions": ["gun"], "review": 1.0, "block": 1.0}
NSFW_PASS = {"review": 1.0, "block": 1.0}
CLIP_POLICIES = {
    "with_clip": {"models": ["open_nsfw", "clip"], "min_consistency": 0.01,
                  "labels": {"nsfw": NSFW_PASS, "weapons": WEAPONS}},
    # above the consistency the tiny CLIP gives CLIP_PROMPT's image (asserted where it is used)
    "strict_clip": {"models": ["clip"], "min_consistency": 0.2, "labels": {"weapons": WEAPONS}},
}
# A prompt whose first generated image (tiny SD, seed 42) the tiny random CLIP finds consistent
# with it (cosine about 0.05, over with_clip's 0.01); the second (seed 43) it does not (a
# negative cosine: consistency 0). Random networks rarely pair an image with its prompt.
CLIP_PROMPT = "a photo"


def clip_config(tmp: Path, policy: str | None = None, weights: Path | None = None
                ) -> WorkerConfig:
    return load_config(engines={"cache_dir": str(tmp)}, model={"intra_op_threads": 1},
                       moderation={"policies": POLICIES | CLIP_POLICIES,
                                   "clip": {"weights_dir": str(weights or tmp)}},
                       generation={"random_weights": "tiny", "device": "cpu",
                                   **({"moderation": {"policy": policy}} if policy else {})})


@pytest.fixture(scope="module")
def clip_safety(cache_dir: Path, tiny_clip: Path) -> Iterator[Safety]:  # noqa: F811
    """open_nsfw and the tiny random CLIP, built through moderation's registry."""
    from worker.tasks.moderation.models import make_models
    from worker.tasks.moderation.served_policies import effective_policies

    cfg = clip_config(cache_dir, weights=tiny_clip)
    policies = {n: p for n, p in effective_policies(cfg).items() if n in CLIP_POLICIES}
    s = Safety(make_models(cfg, policies), None, None, policies)
    s.warm_up()
    yield s
    s.close()


def test_an_image_policy_running_clip_is_served(tmp_path: Path, tiny_clip: Path  # noqa: F811
                                                ) -> None:
    """CLIP scores generated images (the prompt as the caption): its policy is not refused,
    and CLIP is one of the image models."""
    image, prompt, policies = resolve(clip_config(tmp_path, "with_clip", tiny_clip))
    assert (image, prompt, list(policies)) == ("with_clip", None, ["with_clip"])
    s = make_safety(clip_config(tmp_path, "with_clip", tiny_clip))
    assert s is not None
    try:
        assert s.image_models == ["open_nsfw", "clip"]
    finally:
        s.close()


def test_a_generated_image_carries_clip_s_consistency_with_its_prompt(
        torch_engines: SdEngines, clip_safety: Safety, tmp_path: Path, contract: Any) -> None:
    import torch

    task = task_with(torch_engines, clip_safety, tmp_path, image="with_clip", prompt=None)
    try:
        (r,) = run(task, payload(prompt=CLIP_PROMPT, num_images=2))
    finally:
        task.close()
    model = clip_safety.models["clip"]
    checks = []
    for im in r.images:
        check = im.check
        assert check is not None and im.png, "allow and review images are published"
        assert set(check.scores) == {"open_nsfw.nsfw", "open_nsfw.sfw", "clip.weapons",
                                     "clip.neutral", "clip.consistency"}
        # the published pixels, scored again with the prompt as their caption
        px = torch.from_numpy(rgb(im.png)[None].copy())
        (again,) = model.score_pixels("with_clip", px, [CLIP_PROMPT])
        assert {f"clip.{k}": v for k, v in again.items()} == {
            k: v for k, v in check.scores.items() if k.startswith("clip.")}
        checks.append(check)
    valid(contract, r)
    # each image its own verdict: the first shows its prompt, the second does not
    first, second = checks
    assert first.scores["clip.consistency"] > 0.01
    assert (first.verdict, first.rule) == (Verdict.ALLOW, "allow")
    assert second.scores["clip.consistency"] < 0.01
    assert (second.verdict, second.rule) == (Verdict.REVIEW, "review:clip.consistency")


def test_an_image_below_min_consistency_is_published_for_review(
        torch_engines: SdEngines, clip_safety: Safety, tmp_path: Path, contract: Any) -> None:
    task = task_with(torch_engines, clip_safety, tmp_path, image="strict_clip", prompt=None)
    try:
        v2, v1 = run(task, payload(id="c", prompt=CLIP_PROMPT),
                     payload(id="c1", v=1, prompt=CLIP_PROMPT))
    finally:
        task.close()
    (im,) = v2.images
    check = im.check
    assert check is not None and im.png, "a review image is published"
    assert 0 < check.scores["clip.consistency"] < 0.2
    assert check.verdict is Verdict.REVIEW and check.rule == "review:clip.consistency"
    assert "min_consistency" in (check.reason or "")
    valid(contract, v2)
    # v1 has no verdict field: the image is published as before
    assert v1.error is None and v1.images[0].png and v1.images[0].check is None
    valid(contract, v1)
