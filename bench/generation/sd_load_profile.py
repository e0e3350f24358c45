"""Where a generation worker's warm start goes: load the SD engines from the engine cache in a
fresh process, timing each phase, for the current loader and candidate alternatives.

    python bench/generation/sd_load_profile.py --cache-dir /tmp/gws --out bench/results

The parent builds the cache once (random weights, full SD 1.5 architecture), then runs each
variant in its own fresh process, ``--runs`` times. Phases are wall-clock seconds with CUDA
synchronised at each boundary. Variants (all end with the same modules in the engine precision,
checked against the current loader's parameters by a checksum):

- ``current``: skeleton built on the GPU in fp32 (random init), ``torch.load(map_location=gpu)``,
  ``load_state_dict``, then ``.to(fp16)`` -- what ``engines.models.sd.build`` does.
- ``no_init``: skeleton built on the GPU with parameter initialisation
  skipped (it is overwritten anyway), then the same load.
- ``no_init_mmap``: as above, the state dict read with ``mmap=True`` onto the CPU and copied
  by ``load_state_dict``.
- ``no_init_threads``: as ``no_init``, the three components loaded concurrently.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import environment, median, write  # noqa: E402

VARIANTS = ("current", "no_init", "no_init_mmap", "no_init_threads")


def _engines(cache_dir: Path, device: str, arch: str) -> Any:
    from engines.cache import EngineCache
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.engines import SdEngineOptions, make_sd_engines
    from engines.models.sd.specs import Resolution
    from engines.models.sd.weights import RandomSdWeights

    res = 512 if arch == "sd15" else 64
    opts = SdEngineOptions(backend="torch", precision=_precision(device), device=device,
                           unet_sizes=(2, 16), text_sizes=(2, 16), vae_sizes=(1, 8))
    return make_sd_engines(RandomSdWeights(ARCHES[arch], 0), (Resolution(res, res),), opts,
                           EngineCache(cache_dir))


def _precision(device: str) -> str:
    return "fp16" if device.startswith("cuda") else "fp32"  # the torch runner's CPU rule


def child(args: argparse.Namespace) -> None:
    phases: dict[str, float] = {}
    mark = [time.monotonic()]

    def tick(name: str) -> None:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - mark[0], 3)
        mark[0] = now

    import torch

    tick("import_torch")
    torch.zeros(1, device=args.device)
    tick("cuda_init")
    from engines.models.sd import COMPONENTS
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.build import sd_cache_loader
    from engines.models.sd.nets import skeleton
    from engines.models.sd.weights import RandomSdWeights

    weights = RandomSdWeights(ARCHES[args.arch], 0)
    dtype = torch.float16 if _precision(args.device) == "fp16" else torch.float32
    from engines.cache import EngineCache

    cache = EngineCache(args.cache_dir)
    tick("imports_rest")
    import diffusers  # noqa: F401
    from diffusers import AutoencoderKL, UNet2DConditionModel  # noqa: F401
    from transformers import CLIPTextModel  # noqa: F401

    tick("import_diffusers_transformers")
    entries = {c: sd_cache_loader(cache, weights, c, "torch", args.device,
                                  _precision(args.device))()
               for c in COMPONENTS}
    tick("cache_lookup")

    def load_one(c: str, v: str, timed: bool) -> Any:
        def t(name: str) -> None:
            if timed:
                tick(name)

        if v == "current":
            net = skeleton(c, weights.config(c), args.device)
            t("skeleton")
            state = torch.load(entries[c].artifact, map_location=args.device, weights_only=True)
            t("torch_load")
            net.load_state_dict(state)
            t("load_state_dict")
            net = net.to(device=args.device, dtype=dtype).eval()
            t("to_dtype")
            return net
        net = skeleton(c, weights.config(c), args.device, initialised=False).to(dtype=dtype)
        t("skeleton")
        mmap = v.endswith("_mmap")
        state = torch.load(entries[c].artifact, map_location="cpu" if mmap else args.device,
                           weights_only=True, mmap=mmap)
        t("torch_load")
        net.load_state_dict(state)
        t("load_state_dict")
        return net.eval()

    if args.variant.endswith("_threads"):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:
            nets = dict(zip(COMPONENTS, pool.map(lambda c: load_one(c, args.variant, False),
                                                 COMPONENTS), strict=True))
        tick("load_all_threads")
    else:
        nets = {c: load_one(c, args.variant, True) for c in COMPONENTS}
    total = time.monotonic() - T0
    # Same parameters whatever the loader: a checksum over every parameter and buffer.
    sums = {c: float(sum(p.double().sum().item() for p in n.state_dict().values()))
            for c, n in nets.items()}
    dtypes = sorted({str(p.dtype) for n in nets.values() for p in n.parameters()})
    print(json.dumps({"variant": args.variant, "phases_s": phases,
                      "process_to_loaded_s": round(total, 3), "checksums": sums,
                      "param_dtypes": dtypes}))


def run_child(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--cache-dir",
                          str(args.cache_dir), "--device", args.device, "--arch", args.arch],
                         capture_output=True, text=True, check=False, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"variant": variant, "error": (out.stderr or out.stdout)[-2000:]}
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", type=Path, default=Path("/tmp/gws"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--arch", default="sd15", choices=("sd15", "tiny"))
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    p.add_argument("--child", dest="variant", choices=VARIANTS)
    args = p.parse_args()
    if args.variant:
        return child(args)
    t = time.monotonic()
    engines = _engines(args.cache_dir, args.device, args.arch)
    engines.activate()  # builds the cache entries if missing
    engines.deactivate()
    built_s = time.monotonic() - t
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.runs):  # interleaved, so a drift in the machine hits every variant
        for v in VARIANTS:
            runs[v].append(run_child(args, v))
            print(json.dumps(runs[v][-1]), flush=True)  # kept in the log if the call is cut
    ref = next((r["checksums"] for r in runs["current"] if "checksums" in r), None)
    summary = {}
    for v, rs in runs.items():
        ok = [r for r in rs if "process_to_loaded_s" in r]
        summary[v] = {
            "median_process_to_loaded_s": median([r["process_to_loaded_s"] for r in ok])
            if ok else None,
            "same_parameters_as_current": bool(ok) and ref is not None and all(
                all(abs(r["checksums"][c] - ref[c]) <= 1e-6 * max(1.0, abs(ref[c]))
                    for c in ref) for r in ok),
        }
    rec = {"benchmark": "sd15_engine_load_profile", "env": environment(),
           "note": f"RANDOM WEIGHTS ({args.arch} architecture) from the engine cache; fresh "
                   "processes",
           "params": {"runs": args.runs, "device": args.device, "arch": args.arch,
                      "cache_dir": str(args.cache_dir)},
           "cache_build_or_check_s": round(built_s, 1), "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    print("wrote", write("sd-load-profile", rec, args.out))


if __name__ == "__main__":
    main()
