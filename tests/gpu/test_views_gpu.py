"""The GPU task accepts and scores what the CPU path does: CMYK and EXIF-rotated JPEGs (nvJPEG
refuses the first and ignores the second), a picture hidden in the alpha channel, an animation
whose later frame is the worst. Reference: the float32 ONNX model on the CPU over the same
views (decode_views, worst view)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from worker.tasks.moderation.images.jpeg_ops import dali_available, nvimgcodec_available


def _cases() -> dict[str, bytes]:
    from PIL import Image

    from tests.harness.conformance_inputs import synthetic_photo

    photo = synthetic_photo()
    out: dict[str, bytes] = {}
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=92)
    out["plain"] = buf.getvalue()
    for name, size in (("hd_720p", (1280, 720)), ("hd_1080p", (1920, 1080))):
        buf = io.BytesIO()  # an HD frame's size and coding (4:2:0 baseline, q85)
        photo.resize(size, Image.Resampling.BICUBIC).save(buf, "JPEG", quality=85)
        out[name] = buf.getvalue()
    buf = io.BytesIO()
    photo.convert("CMYK").save(buf, "JPEG", quality=92)
    out["cmyk"] = buf.getvalue()
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=92, exif=exif.tobytes())
    out["rotated"] = buf.getvalue()
    ramp = Image.fromarray(np.repeat(np.arange(256, dtype=np.uint8)[:, None], 256, 1))
    alpha = Image.eval(ramp, lambda v: 255 - v)
    rgba = Image.merge("RGBA", (*Image.new("RGB", (256, 256)).split(), alpha))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    out["alpha"] = buf.getvalue()
    out["truncated"] = out["plain"][: len(out["plain"]) * 2 // 3]
    black = Image.new("RGB", (128, 128))
    frames = [black, black, ramp.resize((128, 128)).convert("RGB"), black]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    out["animated"] = buf.getvalue()
    return out


NVIMGCODEC = pytest.mark.skipif(not nvimgcodec_available(),
                                reason="nvImageCodec (nvidia-nvimgcodec-cu13) is not installed")
DALI = pytest.mark.skipif(not dali_available(),
                          reason="DALI (nvidia-dali-cuda130) is not installed")
DECODERS = ["torchvision", pytest.param("nvimgcodec", marks=NVIMGCODEC),
            pytest.param("dali", marks=DALI)]


def _gpu_outcomes(cases: dict[str, bytes], preprocess: str, decoder: str = "torchvision"
                  ) -> dict[str, Any]:
    """Each case's outcome from the GPU model (open_nsfw on the torch backend, no engine
    cache), run in batches of at most 8 jobs, by case name."""
    from tests.unit.tasks.moderation.parts_support import image_part, run_batch
    from worker.config import load_config
    from worker.tasks.batcher import Batch
    from worker.tasks.moderation.models.open_nsfw.engine import make_runner
    from worker.tasks.moderation.models.open_nsfw.gpu import OpenNsfwGpuModel

    cfg = load_config(model={"backend": "torch", "preprocess": preprocess,
                             "jpeg_roundtrip": False,
                             **({"gpu_jpeg_decoder": decoder} if preprocess == "gpu" else {})},
                      engines={"use_cache": False})
    runner, plan = make_runner(cfg)
    runner.activate()
    task = OpenNsfwGpuModel(cfg, runner, plan.spec, plan.profiles)
    task.warm_up(plan.profiles)
    names = list(cases)
    outcomes: dict[str, Any] = {}
    try:
        # Until nvJPEG has warmed up the CPU decodes: wait, so the GPU path is what is tested.
        assert task.wait_for_gpu_decoder(120) == (preprocess == "gpu")
        for start in range(0, len(names), 8):
            parts = [image_part(name, cases[name], i)
                     for i, name in enumerate(names[start:start + 8])]
            outcomes |= {o.job_id: o for o in run_batch(task, Batch(plan.profiles[0], parts, 8))}
    finally:
        task.close()
        runner.deactivate()
    return outcomes


@pytest.mark.parametrize(("preprocess", "decoder"), [
    ("cpu", "torchvision"), ("gpu", "torchvision"),
    pytest.param("gpu", "nvimgcodec", marks=NVIMGCODEC), pytest.param("gpu", "dali", marks=DALI)])
def test_gpu_task_scores_what_a_person_sees_like_the_cpu_path(preprocess: str, decoder: str
                                                              ) -> None:
    from engines.backends.onnxruntime import OrtRunner
    from worker.config import load_config
    from worker.exceptions import JobRejected
    from worker.tasks.moderation.images.cpu import decode_views
    from worker.tasks.moderation.models.open_nsfw.engine import engine_plan
    from worker.tasks.moderation.models.open_nsfw.preprocess import preprocess_open_nsfw

    cases = _cases()
    names = list(cases)
    outcomes = _gpu_outcomes(cases, preprocess, decoder)
    truncated = outcomes.pop("truncated")
    # Rejected like the CPU path rejects it (nvJPEG alone would have scored it).
    assert truncated.rejection is not None and "corrupt image data" in str(truncated.rejection)
    with pytest.raises(JobRejected):
        decode_views(cases["truncated"])
    names.remove("truncated")
    with OrtRunner(engine_plan(load_config()).spec) as ort:
        for name in names:
            o = outcomes[name]
            assert o.rejection is None and o.scores is not None, (name, o.rejection)
            rows = np.stack([preprocess_open_nsfw(v, jpeg_roundtrip=False)
                             for v in decode_views(cases[name])])
            ref = float(ort.infer({"input:0": rows}).result()["outputs"][:, 1].max())
            got = o.scores["nsfw"]
            print(f"{preprocess} {decoder} {name}: gpu {got:.4f} cpu fp32 {ref:.4f}")
            # fp16 engine, and nvJPEG's IDCT on the gpu path for the plain JPEG.
            assert abs(got - ref) < 3e-2, (name, got, ref)


@pytest.mark.parametrize("decoder", DECODERS)
def test_gpu_task_accepts_and_rejects_mutated_jpegs_like_the_cpu_path(decoder: str) -> None:
    # On an H200 nvJPEG decoded two files whose DC Huffman table holds
    # a symbol over 15, which the CPU decoder refuses; jpeg_plain now sends files with tables
    # libjpeg would refuse to the CPU decoder (images/jpeg_tables.py). A failure names the files
    # the two paths judge differently.
    from tests.harness.conformance_inputs import mutated_jpegs
    from worker.exceptions import JobRejected
    from worker.tasks.moderation.images.cpu import decode_views

    cases = mutated_jpegs()
    cpu_accepts: dict[str, bool] = {}
    for name, data in cases.items():
        try:
            decode_views(data)
            cpu_accepts[name] = True
        except JobRejected:
            cpu_accepts[name] = False
    names = list(cases)
    gpu_accepts = {name: o.rejection is None
                   for name, o in _gpu_outcomes(cases, "gpu", decoder).items()}
    print(f"\nmutated JPEGs: {sum(cpu_accepts.values())} of {len(cases)} accepted on the CPU")
    differ = sorted(n for n in names if gpu_accepts[n] != cpu_accepts[n])
    assert not differ, [(n, "gpu accepts" if gpu_accepts[n] else "gpu rejects") for n in differ]
