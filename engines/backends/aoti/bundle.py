"""The AOTInductor artifact: one ``.pt2`` package per static shape and the weights they share
(:mod:`.weights`), stored in one zip.

One file, so the engine cache's SHA-256 covers every package and the weights. Stored
uncompressed (a package is itself a zip of compiled code; compressing again gains nothing and
costs load time). Members are named by :func:`shape_name`. Each is loaded from a file
(:func:`load_from_bundle`): torch's loader takes a path, and given bytes it writes them to a
file itself, after the caller has held the whole package in memory. For a 1 GB package on the
2-core VM that took 11.6-13.9 s against 5.4-6.2 s streamed to a file.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engines.backends.aoti.weights import bind, write_weights
from engines.exceptions import EngineError

SUFFIX = ".pt2"


def shape_name(batch: int, item: tuple[int, ...]) -> str:
    """``b8_224x224x3``: one static shape's package (its batch size and item shape)."""
    return f"b{batch}_{'x'.join(str(d) for d in item) or 'scalar'}"


def write_bundle(out: Path, packages: Mapping[str, Path], weights: Mapping[str, Any]) -> None:
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        for name, path in sorted(packages.items()):
            z.write(path, name + SUFFIX)
        write_weights(z, weights)


def bundle_names(path: Path) -> set[str]:
    """The shape names the bundle holds a package for, without reading the packages."""
    try:
        with zipfile.ZipFile(path) as z:
            return {n.removesuffix(SUFFIX) for n in z.namelist()
                    if n.endswith(SUFFIX) and "/" not in n}
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"AOTInductor bundle {path} does not read: {exc}") from exc


def load_from_bundle(path: Path, name: str, cuda: bool, weights: Mapping[str, Any]) -> Any:
    """One shape's package, streamed from the bundle to a temporary file and loaded from
    there (see the module's note), bound to ``weights`` (:func:`~.kept.shared_weights` or
    :func:`~.weights.read_weights`; the caller keeps them alive as long as the package)."""
    with tempfile.NamedTemporaryFile(suffix=SUFFIX) as f:
        try:
            with zipfile.ZipFile(path) as z, z.open(name + SUFFIX) as member:
                shutil.copyfileobj(member, f, 1 << 24)  # the member's CRC is checked at its end
            f.flush()
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise EngineError(f"AOTInductor bundle {path}: package {name} does not read: "
                              f"{exc}") from exc
        package = load_package(Path(f.name), cuda)
    bind(package, weights, f"AOTInductor bundle {path}: package {name}")
    return package


def load_package(path: Path, cuda: bool) -> Any:
    """A package file, loaded ready to call (and to capture in a CUDA graph: single-threaded;
    the runner's lock keeps it so) by torch's C++ loader (:class:`Package`)."""
    import torch

    if cuda:
        _onnxruntime_loaded()
    try:
        # (path, model name, run single-threaded, runners, device index: -1 = the current)
        return Package(torch._C._aoti.AOTIModelPackageLoader(str(path), "model", True, 1, -1))
    except (RuntimeError, TypeError) as exc:  # TypeError: a binding whose arguments changed
        raise EngineError(f"AOTInductor package {path} does not load: {exc}") from exc


class Package:
    """A loaded package, called like the network it was compiled from.

    torch's C++ loader used directly, without ``torch._inductor.aoti_load_package``: that one
    imports ``torch._inductor`` (1.5 s of every start on the H200 machine with bytecode
    compiled, against 0.01-0.06 s for the package loads themselves) only to read
    the package's metadata and compare its CPU ISA with this machine's (which compiled and ran
    test libraries in subprocesses: 36 s on the first load there). The engine cache key already
    pins the device, the torch version and the build options. Four fresh processes on the H200
    that imported only torch, CUDA and onnxruntime loaded the SD packages this way
    (``bench/aoti/aoti_cxx_probe.py``)."""

    def __init__(self, loader: Any) -> None:
        from torch.utils import _pytree

        self._loader = loader
        self._pytree = _pytree
        self._out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])

    def __call__(self, *inputs: Any) -> Any:
        return self._pytree.tree_unflatten(self._loader.boxed_run(list(inputs)), self._out_spec)

    def get_constant_fqns(self) -> list[str]:
        return list(self._loader.get_constant_fqns())

    def load_constants(self, constants: dict[str, Any], *, check_full_update: bool,
                       user_managed: bool) -> None:
        # (constants, use_inactive: into the buffer in use, check_full_update, user_managed)
        self._loader.load_constants(constants, False, check_full_update, user_managed)


def _onnxruntime_loaded() -> None:
    """Import onnxruntime (a dependency of the worker in every install) before the first CUDA
    package loads. On the H200 machine (torch 2.11.0+cu130, driver 580) every
    AOTInductor package load in a process without it died with SIGSEGV inside torch's package
    loader (``AOTIModelPackageLoader``): 17 of 17, from a tiny two-layer MLP to the SD nets,
    in fresh processes and right after compiling, and also through the model-container
    runner on the unzipped library. The same package loaded in a process that had imported
    onnxruntime first (once, the last device seconds of that session), and the GPU tests
    (which import it for their float32 reference) compiled and served open_nsfw packages the
    same day. Why is not known (not found in torch's or onnxruntime's issues); this is the
    measured workaround, harmless where the crash does not happen."""
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
