"""The SD 1.5 UNet step and a 20-step image on the compiled (aoti) engines against today's
torch engines, in one run on a quiet GPU (issue 16: <= 6 ms at batch 2, <= 30 ms at 16).

The aoti engines come from an engine cache that ``trt-worker engines build`` filled (e.g.
``bench/aoti/engines_build.py``, one UNet entry per batch size, so a batch-2 worker's key is among
them); nothing is compiled here, a missing entry is an error. Per UNet batch size, from the
cached bundle: the package called directly, a CUDA graph over it, and the eager network under
a graph (today's torch engine), each the median ms per call on device-resident inputs, timed
with the same function as the build (:func:`engines.backends.aoti.build.time_variants`), plus
the build's own record (compile seconds, error against the float32 network, what it serves).
Then one 20-step 512x512 image at batch 1 through the GenerationTask on each backend
(text batch 2, UNet batch 2, VAE batch 1: one CFG pair per step), median of ``--runs``.

    python bench/generation/sd_steps.py --cache DIR --out DIR [--autotune] [--unet-sizes 2,16]

RANDOM weights (full SD 1.5 architecture): timings are real, images are noise.
``--arch tiny --device cpu`` is a dry run of every code path but CUDA's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402

RES = {"sd15": 512, "tiny": 64}


def options(args: argparse.Namespace, backend: str, unet: int) -> Any:
    from engines.models.sd.engines import SdEngineOptions

    cuda = args.device.startswith("cuda")
    return SdEngineOptions(backend=backend, precision="fp16" if cuda else "fp32",
                           device=args.device, autotune=args.autotune, text_sizes=(2,),
                           unet_sizes=(unet,), vae_sizes=(1,))


def weights_and_res(args: argparse.Namespace) -> tuple[Any, Any]:
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    r = RES[args.arch]
    return RandomSdWeights(ARCHES[args.arch], 0), (Resolution(r, r),)


def unet_step(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """The three ways to serve one UNet batch size, timed from the cached bundle."""
    import torch

    from engines.backends.aoti.build import sample_args, static_keys, time_variants
    from engines.backends.aoti.bundle import bundle_names, load_from_bundle
    from engines.backends.aoti.weights import read_weights
    from engines.backends.torch.artifact import in_engine_form, native_net
    from engines.cache import EngineCache
    from engines.models.sd.engines import sd_plans

    weights, res = weights_and_res(args)
    _, plans = sd_plans(weights, res, options(args, "aoti", batch), EngineCache(args.cache))
    plan = plans["unet"]
    loader = plan.loader()
    entry = loader.cache.lookup(loader.recipe)
    if entry is None:
        raise SystemExit(f"no cached aoti UNet for batch {batch} under {args.cache} "
                         f"(key {loader.recipe.key}); build it first (bench/aoti/engines_build.py)")
    t = time.monotonic()
    cuda = args.device.startswith("cuda")
    (name,) = bundle_names(entry.artifact)
    constants = read_weights(entry.artifact, args.device)
    weights_s = time.monotonic() - t
    model = load_from_bundle(entry.artifact, name, cuda, constants)
    load_s = time.monotonic() - t
    native = native_net(plan.spec)
    net = in_engine_form(native.fresh(args.device)[0], native, args.device, plan.precision)
    (key,) = static_keys(plan)  # this plan's one batch size
    feeds = sample_args(plan, key, args.device)
    with torch.no_grad():
        diff = float((model(*feeds).float() - net(*feeds).float()).abs().max())
    ms = time_variants(model, net, feeds, cuda)
    build = entry.sidecar.get("build", {}).get("shapes", {}).get(name, {})
    row = {"batch": batch, "shape": name, "key": entry.key, "load_s": round(load_s, 2),
           "weights_load_s": round(weights_s, 2),
           "bundle_bytes": entry.sidecar["artifact"]["bytes"], "ms": ms,
           "package_vs_eager_max_abs_diff": diff, "build": build}
    del model, net, constants
    if cuda:
        torch.cuda.empty_cache()
    return row


def image_latency(args: argparse.Namespace, backend: str, blobs: Path) -> dict[str, Any]:
    """One 20-step image at batch 1 through the GenerationTask on ``backend``'s engines."""
    from bench.generation.generation_bench import timed_jobs
    from engines.cache import EngineCache
    from engines.models.sd.engines import make_sd_engines
    from worker.config.generation import GenerationSettings
    from worker.tasks.generation.blobs import LocalBlobStore
    from worker.tasks.generation.task import GenerationTask

    weights, res = weights_and_res(args)
    built: list[str] = []
    engines = make_sd_engines(weights, res, options(args, backend, 2), EngineCache(args.cache),
                              on_build=lambda r: built.append(r.model_id))
    if backend == "aoti" and built:
        raise SystemExit(f"aoti engines not cached: {built}")
    r = RES[args.arch]
    g = GenerationSettings(random_weights=args.arch, sizes=[{"width": r, "height": r}],
                           backend=backend, device=args.device, text_batch_sizes=[2],
                           unet_batch_sizes=[2], vae_batch_sizes=[1], png_threads=2)
    t = time.monotonic()
    engines.activate()
    task = GenerationTask(g, engines, LocalBlobStore(blobs), own_engines=False,
                          max_in_flight_batches=1)
    task.warm_up()
    ready_s = time.monotonic() - t
    try:
        wall, stages = timed_jobs(task, [{"id": "one", "steps": args.steps, "seed": 1}],
                                  args.runs)
    finally:
        task.close()
        engines.deactivate()
    return {"backend": backend, "steps": args.steps, "built_here": built,
            "activate_and_warm_up_s": round(ready_s, 2), "image_s": wall, "stages_ms": stages,
            "denoise_ms_per_step": stages.get("denoise", 0.0) / args.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--autotune", action="store_true",
                    help="the packages were built with max-autotune (another cache key)")
    ap.add_argument("--unet-sizes", default="2,16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--arch", choices=sorted(RES), default="sd15")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let cuDNN time its algorithms per shape (the packages' convolutions "
                         "are cuDNN calls)")
    ap.add_argument("--skip-images", action="store_true")
    args = ap.parse_args()
    if args.cudnn_benchmark:
        import torch

        torch.backends.cudnn.benchmark = True
    rec: dict[str, Any] = {"bench": "sd_steps", "weights": "random", "env": environment(),
                           "params": {k: str(v) for k, v in vars(args).items()}}
    if not args.device.startswith("cuda"):
        rec["note"] = "CPU DRY RUN: not a measurement"
    rec["unet"] = []
    for b in (int(x) for x in args.unet_sizes.split(",")):
        rec["unet"].append(unet_step(args, b))
        row = rec["unet"][-1]
        print(f"UNet b{b}: {row['ms']} ms (build chose {row['build'].get('serve')}, compiled "
              f"in {row['build'].get('compile_seconds')} s, load {row['load_s']} s)", flush=True)
    rec["image"] = []
    with tempfile.TemporaryDirectory() as blobs:
        for backend in () if args.skip_images else ("aoti", "torch"):
            rec["image"].append(image_latency(args, backend, Path(blobs)))
            row = rec["image"][-1]
            print(f"{args.steps}-step image b1 on {backend}: {row['image_s'] * 1e3:.0f} ms, "
                  f"{row['denoise_ms_per_step']:.2f} ms per step ({row['stages_ms']})",
                  flush=True)
    print("wrote", write("sd-steps" if args.device.startswith("cuda") else "sd-steps-cpu-dryrun",
                         rec, args.out))


if __name__ == "__main__":
    main()
