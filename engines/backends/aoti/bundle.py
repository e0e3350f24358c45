"""The AOTInductor artifact: one ``.pt2`` package per static shape, stored in one zip.

One file, so the engine cache's SHA-256 covers every package. Stored uncompressed (a package
is itself a zip of compiled code and weights; compressing again gains nothing and costs load
time). Members are named by :func:`shape_name`; each is loaded from memory.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from engines.exceptions import EngineError

SUFFIX = ".pt2"


def shape_name(batch: int, item: tuple[int, ...]) -> str:
    """``b8_224x224x3``: one static shape's package (its batch size and item shape)."""
    return f"b{batch}_{'x'.join(str(d) for d in item) or 'scalar'}"


def write_bundle(out: Path, packages: Mapping[str, Path]) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for name, path in sorted(packages.items()):
            z.write(path, name + SUFFIX)


def read_bundle(path: Path) -> dict[str, bytes]:
    """Every package in the bundle by shape name; a damaged bundle is an EngineError (the cache
    verified its hash, so this means a builder wrote a bad one)."""
    try:
        with zipfile.ZipFile(path) as z:
            return {n.removesuffix(SUFFIX): z.read(n) for n in z.namelist()
                    if n.endswith(SUFFIX) and "/" not in n}
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"AOTInductor bundle {path} does not read: {exc}") from exc


def load_package(data: bytes, cuda: bool) -> Any:
    """A package from memory, ready to call (and to capture in a CUDA graph: single-threaded;
    the runner's lock keeps it so): by torch's C++ package loader where this torch has the one
    :class:`PackageCall` knows, else by ``aoti_load_package`` (CUDA packages without the
    CPU-ISA probe, :func:`skip_cpu_isa_probe`)."""
    import torch

    if cuda:
        # The C++ loader expects an initialised CUDA context; aoti_load_package's device check
        # makes one on its way. Without it, loading a CUDA package crashed the process (H200).
        torch.cuda.init()
    direct = _load_direct(data)
    if direct is not None:
        return direct
    with skip_cpu_isa_probe() if cuda else contextlib.nullcontext():
        return torch._inductor.aoti_load_package(io.BytesIO(data), run_single_threaded=True)


class PackageCall:
    """A loaded package called as ``aoti_load_package``'s model is (inputs flattened, outputs
    rebuilt by the package's own call spec), without importing ``torch._inductor``: that import
    is seconds of a worker's start (3.8 s on the H200 machine, bench/NOTES.md) and serving
    needs nothing from it. The engine cache's key already pins the device the package was
    built for, which is what ``aoti_load_package``'s metadata check compares."""

    def __init__(self, loader: Any) -> None:
        from torch.utils import _pytree as pytree

        self._pytree, self.loader = pytree, loader
        in_spec, out_spec = loader.get_call_spec()
        self._out_spec = pytree.treespec_loads(out_spec)
        pytree.treespec_loads(in_spec)  # a spec this torch cannot read fails here, at load
        self._run = getattr(loader, "boxed_run", None) or loader.run

    def __call__(self, *args: Any) -> Any:
        import torch

        flat = [x for x in self._pytree.tree_flatten((args, {}))[0]
                if isinstance(x, torch.Tensor)]
        return self._pytree.tree_unflatten(self._run(flat), self._out_spec)


def _load_direct(data: bytes) -> PackageCall | None:
    """The package through ``torch._C._aoti.AOTIModelPackageLoader``, or None where this torch
    lacks it or takes other arguments (the caller then uses ``aoti_load_package``)."""
    import torch

    loader_cls = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader_cls is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".pt2") as f:  # the loader reads a path
        f.write(data)
        f.flush()
        # (path, model name, run single-threaded, runners, device index[, stream affinity])
        for args in (("model", True, 1, -1), ("model", True, 1, -1, False)):
            try:
                return PackageCall(loader_cls(f.name, *args))
            except TypeError:
                continue
    return None


@contextlib.contextmanager
def skip_cpu_isa_probe() -> Iterator[None]:
    """``aoti_load_package`` compares the package's device metadata with this machine's, and
    finding this machine's CPU ISA compiles and test-loads a library per ISA in subprocesses:
    36 s on the first load in a process on the H200 machine (torch 2.11; Inductor's
    ``cpp.vec_isa_ok`` does not skip the AMX probe). For a CUDA package the CPU ISA only feeds a
    warning (its kernels are GPU kernels, and the engine cache key already pins the GPU), so
    while loading, the metadata leaves the ISA out and the comparison skips it. torch has no
    option for this; the patch is scoped to the load and falls back to the probe if torch's
    internals move."""
    try:
        from torch._inductor import codecache, cpu_vec_isa
    except ImportError:
        yield
        return
    original = getattr(codecache, "get_device_information", None)
    if original is None:
        yield
        return

    def without_cpu_isa(device_type: str) -> dict[str, str]:
        with mock.patch.object(cpu_vec_isa, "pick_vec_isa", lambda: cpu_vec_isa.invalid_vec_isa):
            info = dict(original(device_type))
        info.pop("AOTI_CPU_ISA", None)
        return info

    with mock.patch.object(codecache, "get_device_information", without_cpu_isa):
        yield
