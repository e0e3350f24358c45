"""Which AOTInductor packages load, and which crash the loader (issue 16's SD engines).

On the H200 (torch 2.11) the builds of all three SD nets died with SIGSEGV in
``aoti_load_package`` right after compiling (2026-12-02), while open_nsfw's packages load.
Each variant here compiles one network in its own process, loads the package there (as the
build does) and then again in fresh processes from the file and from memory, so a crash ends
only that load, and the table says which property matters: size (a synthetic MLP of ~300 MB),
attention (a toy SDPA block), the SD text encoder at the tiny and the full size, and Inductor's
options for large weights (``force_mmap_weights``; weights kept out of the .so).

    [DIAG_PRELOAD=onnxruntime] python bench/aoti_load_diag.py --out DIR [--variants a,b,...]
    python bench/aoti_load_diag.py --libs [PACKAGE.pt2 ...]

``--libs`` prints the shared libraries that importing onnxruntime adds to a process that has
imported torch, and ``ldd`` of the libraries inside the given packages: what the one import
known to stop the crash changes in the process.

Found with it (H200, torch 2.11.0+cu130, 2026-12-02): every load crashed, from the toy SDPA
block and the tiny text encoder up, in the compiling process and in fresh ones; importing
onnxruntime first was the one change after which a package loaded (bench/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from bench.common import environment, write  # noqa: E402

DEV = os.environ.get("DIAG_DEVICE", "cuda:0")  # cpu: a dry run of the script (fp32)
# DIAG_PRELOAD=onnxruntime: import it in every child before loading. The only import found to
# stop the loader's crash on the H200 (2026-12-02); engines.backends.aoti.bundle now does it.
PRELOAD = os.environ.get("DIAG_PRELOAD", "")

VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "sdpa": ("sdpa", {}),
    "mlp300": ("mlp300", {}),
    "text_tiny": ("text_encoder:tiny", {}),
    "text_sd15": ("text_encoder:sd15", {}),
    "text_sd15_mmap": ("text_encoder:sd15", {"aot_inductor.force_mmap_weights": True}),
    "text_sd15_ondisk": ("text_encoder:sd15", {
        "aot_inductor.package_constants_in_so": False,
        "aot_inductor.package_constants_on_disk_format": "pickle_weights"}),
}


def network(kind: str) -> tuple[Any, tuple[Any, ...]]:
    """(fp16 CUDA module, sample inputs)."""
    import torch

    dev, dtype = DEV, torch.float16 if DEV.startswith("cuda") else torch.float32
    if kind == "sdpa":
        class Attn(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = torch.nn.Linear(512, 1536)

            def forward(self, x: Any) -> Any:
                q, k, v = self.qkv(x).view(2, 77, 3, 8, 64).permute(2, 0, 3, 1, 4)
                return torch.nn.functional.scaled_dot_product_attention(q, k, v).sum(1).float()

        return Attn().to(dev, dtype).eval(), (torch.randn(2, 77, 512, device=dev, dtype=dtype),)
    if kind == "mlp300":
        net = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(9)))
        return net.to(dev, dtype).eval(), (torch.randn(8, 4096, device=dev, dtype=dtype),)
    raise ValueError(kind)


def sd_network(component: str, arch: str) -> tuple[Any, tuple[Any, ...]]:

    from engines.assembly import EngineParams
    from engines.backends.aoti.build import sample_args, static_keys
    from engines.backends.torch.artifact import in_engine_form, native_net
    from engines.models.sd.arch import ARCHES
    from engines.models.sd.build import sd_plan
    from engines.models.sd.specs import Resolution, sd_profiles
    from engines.models.sd.weights import RandomSdWeights

    w = RandomSdWeights(ARCHES[arch], 0)
    r = 512 if arch == "sd15" else 64
    profiles = sd_profiles(w.dims(), (Resolution(r, r),), text_sizes=(2,), unet_sizes=(2,),
                           vae_sizes=(1,))
    precision = "fp16" if DEV.startswith("cuda") else "fp32"
    plan = sd_plan(w, component, EngineParams(backend="aoti", precision=precision, device=DEV),
                   profiles.of(component))
    native = native_net(plan.spec)
    net = in_engine_form(native.fresh(DEV)[0], native, DEV, precision)
    (key,) = static_keys(plan)  # batch 2 (1 for the VAE)
    return net, sample_args(plan, key, DEV)


def child_build(name: str, path: Path) -> None:
    """In its own process: compile, then load in-process from memory (as the build does)."""
    import io

    import torch

    if PRELOAD:
        __import__(PRELOAD)
    kind, options = VARIANTS[name]
    if ":" in kind:
        component, arch = kind.split(":")
        net, args = sd_network(component, arch)
    else:
        net, args = network(kind)
    t = time.monotonic()
    with torch.no_grad():
        exported = torch.export.export(net, args)
    torch._inductor.aoti_compile_and_package(exported, package_path=str(path),
                                             inductor_configs=options)
    print(json.dumps({"compiled_s": round(time.monotonic() - t, 1),
                      "bytes": path.stat().st_size}), flush=True)
    model = torch._inductor.aoti_load_package(io.BytesIO(path.read_bytes()),
                                              run_single_threaded=True)
    with torch.no_grad():
        out = model(*args)
    print(json.dumps({"in_process_load": "ok", "shape": list(out.shape)}), flush=True)


def child_load(path: Path, how: str) -> None:
    import io

    import torch

    if PRELOAD:
        __import__(PRELOAD)
    t = time.monotonic()
    src: Any = path if how == "path" else io.BytesIO(path.read_bytes())
    torch._inductor.aoti_load_package(src, run_single_threaded=True)
    print(json.dumps({"load_s": round(time.monotonic() - t, 2)}), flush=True)


def loaded_libs(preload: str) -> list[str]:
    """The shared objects mapped after ``import torch`` (and ``preload``), in a fresh process."""
    code = ("import torch, sys\n"
            f"{'import ' + preload if preload else ''}\n"
            "seen = {l.split()[-1] for l in open('/proc/self/maps') if '.so' in l}\n"
            "print('\\n'.join(sorted(seen)))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    return p.stdout.split()


def libs_report(packages: list[str]) -> None:
    import tempfile
    import zipfile

    base = set(loaded_libs(""))
    for pre in ("onnxruntime", "onnx"):
        added = sorted(set(loaded_libs(pre)) - base)
        print(f"import torch; import {pre} adds {len(added)} libraries:", *added, sep="\n  ")
    for pkg in packages:
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(pkg) as z:
            for name in z.namelist():
                if name.endswith(".so"):
                    so = z.extract(name, tmp)
                    out = subprocess.run(["ldd", so], capture_output=True, text=True, check=False)
                    print(f"ldd {Path(pkg).name}:{name}", out.stdout, sep="\n")


def run(cmd: list[str], timeout: float) -> dict[str, Any]:
    t = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, *cmd],
                           capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "s": round(time.monotonic() - t, 1)}
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    out: dict[str, Any] = {"rc": p.returncode, "s": round(time.monotonic() - t, 1)}
    for x in lines:
        out |= x
    if p.returncode:
        out["stderr_tail"] = [x for x in p.stderr.splitlines() if "Warning" not in x][-12:]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/aoti-diag"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--libs", nargs="*", default=None, metavar="PACKAGE")
    ap.add_argument("--child-build", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--child-load", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.libs is not None:
        return libs_report(args.libs)
    if args.child_build:
        return child_build(args.child_build[0], Path(args.child_build[1]))
    if args.child_load:
        return child_load(Path(args.child_load[0]), args.child_load[1])
    args.work.mkdir(parents=True, exist_ok=True)
    names = args.variants.split(",")
    paths = {n: args.work / f"{n}.pt2" for n in names}
    with ThreadPoolExecutor(len(names)) as pool:
        built = dict(zip(names, pool.map(
            lambda n: run(["--child-build", n, str(paths[n])], args.timeout), names),
            strict=True))
    rows: dict[str, dict[str, Any]] = {
        n: {"options": VARIANTS[n][1], "build": built[n]} for n in names}
    record = {"bench": "aoti_load_diag", "env": environment(), "variants": rows}
    print("wrote", write("aoti-load-diag-builds", record, args.out), flush=True)
    # Fresh-process loads, all at once (a crashing load took ~50 s on the H200).
    loads = [(n, how) for n in names if paths[n].is_file() for how in ("path", "bytes")]
    with ThreadPoolExecutor(max(1, len(loads))) as pool:
        done = pool.map(lambda nh: run(["--child-load", str(paths[nh[0]]), nh[1]], 180), loads)
        for (n, how), result in zip(loads, done, strict=True):
            rows[n][f"fresh_{how}"] = result
    for n in names:
        print(n, json.dumps(rows[n])[:600], flush=True)
    print("wrote", write("aoti-load-diag", record, args.out))


if __name__ == "__main__":
    main()
