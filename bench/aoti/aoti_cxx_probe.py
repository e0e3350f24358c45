"""Does torch's C++ package loader (``torch._C._aoti.AOTIModelPackageLoader``), used without
importing ``torch._inductor`` (1.5 s of a start on the H200 machine), load a cached
bundle's package and answer like ``aoti_load_package`` does? One fresh process per run, which
imports only torch, CUDA and onnxruntime before the load (the loader workaround's order).

    python bench/aoti/aoti_cxx_probe.py BUNDLE [--shape NAME]   # prints one JSON line or crashes
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--shape", default="")
    args = ap.parse_args()
    t = {"start": time.perf_counter()}
    import torch

    torch.zeros(1, device="cuda").sum().item()
    import onnxruntime  # noqa: F401

    t["torch_cuda_onnxruntime"] = time.perf_counter()
    from engines.backends.aoti.bundle import SUFFIX, bundle_names
    from engines.backends.aoti.weights import read_weights

    name = args.shape or sorted(bundle_names(args.bundle))[0]
    weights = read_weights(args.bundle, "cuda:0")
    t["weights"] = time.perf_counter()
    with tempfile.NamedTemporaryFile(suffix=SUFFIX) as f:
        with zipfile.ZipFile(args.bundle) as z:
            f.write(z.read(name + SUFFIX))
        f.flush()
        cls = torch._C._aoti.AOTIModelPackageLoader
        try:  # (path, model, run_single_threaded, num_runners, device_index[, stream affinity])
            loader = cls(f.name, "model", True, 1, -1)
        except TypeError:
            loader = cls(f.name, "model", True, 1, -1, False)
    fqns = loader.get_constant_fqns()
    constants = {k: weights[k] for k in fqns}
    try:  # (map, use_inductor_format, check_full_update, user_managed[, allow_h2d_copy])
        loader.load_constants(constants, False, True, True)
    except TypeError:
        loader.load_constants(constants, False, True, True, False)
    t["cxx_load"] = time.perf_counter()
    meta = loader.get_metadata()
    print("aoti_cxx_probe", json.dumps({
        "bundle": str(args.bundle), "shape": name, "constants": len(fqns),
        "inductor_imported": "torch._inductor" in sys.modules,
        "metadata_keys": sorted(meta)[:8],
        **{k: round(t[k] - t["start"], 3) for k in t if k != "start"}}), flush=True)


if __name__ == "__main__":
    main()
