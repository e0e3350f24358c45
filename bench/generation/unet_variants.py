"""The SD 1.5 UNet compiled with other Inductor settings than the engine's: which ones beat the
default package, and where a step's time goes (issue 16: <= 6 ms at batch 2, <= 30 ms at 16).

Two steps, so that slow compiles can run side by side (detached) and the timing runs alone on a
quiet GPU:

    python bench/generation/unet_variants.py compile --variant NAME [--rewrite fp8] --batch 2 \
        --work DIR
    python bench/generation/unet_variants.py measure --work DIR --out DIR [--profile base-b2]

``compile`` exports the engine's own UNet network (in-house module, fp16, the engine's layout,
random weights from the engine's seed) exactly as ``engines.backends.aoti.build`` does and
compiles it with the engine's options plus the variant's (``VARIANTS``), writing a bundle in the
engine's format (weights apart) and a JSON line of compile seconds and the attention operator the
export chose. ``measure`` loads every bundle in DIR as the runner does, checks it against the
float32 network (IEEE, TF32 off) on the build's sample inputs, times the package and a CUDA graph
over it with the build's own timer, and for ``--profile`` bundles sorts one call's kernel time
by kind (convolution, GEMM, attention, Inductor's Triton kernels, other) with torch.profiler.
``--rewrite`` changes the module before export (``bench/generation/unet_rewrites.py``: fp8
linear layers, fused query-key-value projections).

RANDOM weights (full SD 1.5 architecture): timings are real. ``--arch tiny --device cpu`` is a
dry run of the code paths.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402

# Added to the engine's own options (engines.backends.aoti.options, autotune off).
VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "cdt": {"coordinate_descent_tuning": True},
    "gemm": {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON",
             "max_autotune_conv_backends": "ATEN"},
    "full": {"max_autotune": True},
    "full_cdt": {"max_autotune": True, "coordinate_descent_tuning": True},
}
# Compiled under one attention kernel (PyTorch's own choice when not given).
SDPA = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}
RES = {"sd15": 512, "tiny": 64}


def unet_plan(arch: str, device: str, batch: int) -> Any:
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.engines import SdEngineOptions, sd_plans
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    cuda = device.startswith("cuda")
    o = SdEngineOptions(backend="aoti", precision="fp16" if cuda else "fp32", device=device,
                        autotune=False, text_sizes=(2,), unet_sizes=(batch,), vae_sizes=(1,))
    r = RES[arch]
    _, plans = sd_plans(RandomSdWeights(ARCHES[arch], 0), (Resolution(r, r),), o)
    return plans["unet"]


def sdpa_context(name: str | None) -> Any:
    if name is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA[name]))


def compile_one(args: argparse.Namespace) -> None:
    import torch

    from bench.generation.unet_rewrites import rewrite
    from engines.backends.aoti.build import engine_and_reference, sample_args, static_keys
    from engines.backends.aoti.bundle import shape_name, write_bundle
    from engines.backends.aoti.options import inductor_options

    plan = unet_plan(args.arch, args.device, args.batch)
    net = rewrite(engine_and_reference(plan)[0], args.rewrite)
    (key,) = static_keys(plan)
    feeds = sample_args(plan, key, args.device)
    options = {**inductor_options(args.device, autotune=False), **VARIANTS[args.variant]}
    label = "-".join(x for x in (args.variant, args.sdpa, args.rewrite, f"b{args.batch}") if x)
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pkg = args.work / f"{label}.pt2"
    # The export keeps the composite attention op; Inductor picks the kernel while it lowers
    # it, so the choice has to hold over the compile too.
    with sdpa_context(args.sdpa):
        with torch.no_grad():
            exported = torch.export.export(net, feeds)
        attention = sorted({str(n.target) for n in exported.graph.nodes
                            if "scaled_dot_product" in str(n.target)})
        torch._inductor.aoti_compile_and_package(exported, package_path=str(pkg),
                                                 inductor_configs=dict(options))
    seconds = round(time.monotonic() - started, 1)
    constants = {k: v for k, v in {**exported.state_dict, **exported.constants}.items()
                 if isinstance(v, torch.Tensor)}
    write_bundle(args.work / f"{label}.bundle", {shape_name(*key): pkg}, constants)
    pkg.unlink()
    line = {"label": label, "variant": args.variant, "sdpa": args.sdpa,
            "rewrite": args.rewrite, "batch": args.batch,
            "options": options, "compile_s": seconds, "exported_attention_ops": attention}
    with open(args.work / "compiled.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    print(line, flush=True)


# By name, first match wins. Inductor names its kernels after the ops they fuse, so its own
# kernels go first: "triton_poi_fused_convolution_silu" is a pointwise epilogue, and
# "triton_tem_*" a Triton template (a GEMM, or a convolution under max-autotune).
KINDS = (("triton_template", ("triton_tem",)),
         ("inductor_triton", ("triton_",)),
         ("attention", ("fmha", "flash", "attention", "sdpa")),
         ("convolution", ("conv", "implicit_gemm", "fprop", "dgrad", "wgrad")),
         ("gemm", ("gemm", "nvjet", "cutlass", "cublas")))


def kind_of(kernel: str) -> str:
    low = kernel.lower()
    for kind, marks in KINDS:
        if any(m in low for m in marks):
            return kind
    return "other"


def profile(model: Any, feeds: tuple[Any, ...]) -> dict[str, Any]:
    """One call's device time per kernel kind (ms) and its ten longest kernels."""
    import torch
    from torch.profiler import ProfilerActivity

    with torch.no_grad():
        for _ in range(3):
            model(*feeds)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(*feeds)
            torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for e in prof.events():
        if str(e.device_type).endswith("CUDA"):
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.device_time / 1000
    kinds: dict[str, float] = {}
    for name, ms in per_kernel.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {"total_ms": round(sum(per_kernel.values()), 3),
            "by_kind_ms": {k: round(v, 3) for k, v in sorted(kinds.items())},
            "kernels": len(per_kernel), "top": [[n[:120], round(ms, 3)] for n, ms in top]}


def measure(args: argparse.Namespace) -> None:
    import torch

    from engines.backends.aoti.build import (
        _ieee_fp32,
        engine_and_reference,
        off_by,
        sample_args,
        static_keys,
        time_variants,
    )
    from engines.backends.aoti.bundle import bundle_names, load_from_bundle
    from engines.backends.aoti.weights import read_weights

    cuda = args.device.startswith("cuda")
    compiled = {}
    for raw in (args.work / "compiled.jsonl").read_text().splitlines():
        line = json.loads(raw)
        compiled[line["label"]] = line
    rec: dict[str, Any] = {"bench": "unet_variants", "weights": "random", "env": environment(),
                           "params": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    if not cuda:
        rec["note"] = "CPU DRY RUN: not a measurement"
    nets: dict[int, tuple[Any, Any, tuple[Any, ...]]] = {}
    for label, line in sorted(compiled.items(), key=lambda kv: (kv[1]["batch"], kv[0])):
        b = line["batch"]
        if b not in nets:
            nets.clear()
            if cuda:
                torch.cuda.empty_cache()
            plan = unet_plan(args.arch, args.device, b)
            net, reference = engine_and_reference(plan)
            (key,) = static_keys(plan)
            feeds = sample_args(plan, key, args.device)
            with _ieee_fp32(cuda), torch.no_grad():
                ref = reference(*feeds).double()
            del reference
            nets[b] = (net, ref, feeds)
        net, ref, feeds = nets[b]
        bundle = args.work / f"{label}.bundle"
        # On torch releases that never release weights bound by reference (see
        # engines.backends.aoti.weights) each bundle's copy stays: ~1.7 GB per variant.
        weights = read_weights(bundle, args.device)
        (name,) = bundle_names(bundle)
        model = load_from_bundle(bundle, name, cuda, weights)
        with torch.no_grad():
            error, tolerance = off_by(model(*feeds).double(), ref, "float32",
                                      "fp16" if cuda else "fp32")
        row = {**line, "max_error": error, "tolerance": tolerance,
               "ms": time_variants(model, net, feeds, cuda)}
        if cuda and label in (args.profile or "").split(","):
            row["profile"] = profile(model, feeds)
        rec["rows"].append(row)
        print(label, row["ms"], f"error {error:.2e}", row.get("profile", {}).get("by_kind_ms"),
              flush=True)
        del model, weights
    print("wrote", write("unet-variants" if cuda else "unet-variants-cpu-dryrun", rec, args.out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step", choices=("compile", "measure"))
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="base")
    ap.add_argument("--sdpa", choices=sorted(SDPA), default=None)
    ap.add_argument("--rewrite", choices=("qkv", "fp8", "fp8_qkv"), default=None)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", default=None, help="labels to profile, comma-separated")
    ap.add_argument("--arch", choices=sorted(RES), default="sd15")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    compile_one(args) if args.step == "compile" else measure(args)


if __name__ == "__main__":
    main()
