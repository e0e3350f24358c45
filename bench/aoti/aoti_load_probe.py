"""Where a cached AOTInductor engine's start-up time goes, in a fresh process: torch import,
CUDA context, ``torch._inductor`` import, each package's load and first call, and the whole
runner activation through the engine cache.

python bench/aoti/aoti_load_probe.py --cache DIR --sizes 512,1 [--runner]
python bench/aoti/aoti_load_probe.py --bundles 'DIR/*/*/engine.aoti.zip'   # any cached bundles:
    their weights and every package, loaded in turn (no calls)
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ITEM = (224, 224, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/tmp/aoti-cache"))
    ap.add_argument("--sizes", default="512,1")
    ap.add_argument("--runner", action="store_true", help="time plan.runner().activate() only")
    ap.add_argument("--bundles", default="", help="a glob of engine.aoti.zip files to load")
    ap.add_argument("--stacks-every", type=float, default=0.0,
                    help="print every thread's stack every N seconds (where a slow step waits)")
    args = ap.parse_args()
    if args.stacks_every:
        import faulthandler

        faulthandler.dump_traceback_later(args.stacks_every, repeat=True)
    t = {"start": time.perf_counter()}
    import torch

    t["import_torch"] = time.perf_counter()
    torch.zeros(1, device="cuda").sum().item()
    t["cuda_context"] = time.perf_counter()
    import onnxruntime  # noqa: F401  (the loader's workaround imports it first)

    t["import_onnxruntime"] = time.perf_counter()
    import torch._inductor  # timed on purpose: its import is part of start-up

    t["import_inductor"] = time.perf_counter()
    import torch._inductor.package  # what aoti_load_package imports (the runner no longer)

    t["import_inductor_package"] = time.perf_counter()
    if args.bundles:
        t.update(load_bundles(args.bundles))
    from bench.aoti.aoti_bench import plan_for
    from engines.backends.aoti.bundle import load_from_bundle, shape_name
    from engines.backends.aoti.weights import read_weights

    steps = {}
    for size in (int(s) for s in args.sizes.split(",") if s):
        plan = plan_for(size, args.cache, autotune=True)
        if args.runner:
            started = time.perf_counter()
            runner = plan.runner()
            runner.activate()
            steps[f"runner_activate_b{size}"] = time.perf_counter() - started
            continue
        entry = plan.cache.lookup(plan.recipe())
        assert entry is not None, f"no cached engine for batch {size} in {args.cache}"
        started = time.perf_counter()
        weights = read_weights(entry.artifact, "cuda:0")
        model = load_from_bundle(entry.artifact, shape_name(size, ITEM), True, weights)
        loaded = time.perf_counter()
        x = torch.zeros((size, *ITEM), device="cuda")
        model(x)
        torch.cuda.synchronize()
        steps[f"load_b{size}"] = loaded - started
        steps[f"first_call_b{size}"] = time.perf_counter() - loaded
    names = list(t)
    out = {n: round(t[n] - t[p], 3) for p, n in itertools.pairwise(names)}
    out.update({k: round(v, 3) for k, v in steps.items()})
    print("aoti_load_probe", json.dumps(out), flush=True)


def load_bundles(pattern: str) -> dict[str, float]:
    """Each bundle's weights, then each of its packages: the time each step ended."""
    import glob

    from engines.backends.aoti.bundle import bundle_names, load_from_bundle
    from engines.backends.aoti.weights import read_weights

    ends: dict[str, float] = {}
    kept = []  # the packages point into the weights: both stay alive to the end
    for path in map(Path, sorted(glob.glob(pattern))):
        tag = f"{path.parent.parent.name}/{path.parent.name[:6]}"
        weights = read_weights(path, "cuda:0")
        ends[f"{tag} weights"] = time.perf_counter()
        for name in sorted(bundle_names(path)):
            kept.append(load_from_bundle(path, name, True, weights))
            ends[f"{tag} {name}"] = time.perf_counter()
        kept.append(weights)
    return ends


if __name__ == "__main__":
    main()
