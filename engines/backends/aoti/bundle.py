"""The AOTInductor artifact: one ``.pt2`` package per static shape and the weights they share
(:mod:`.weights`), stored in one zip.

One file, so the engine cache's SHA-256 covers every package and the weights. Stored
uncompressed (a package is itself a zip of compiled code; compressing again gains nothing and
costs load time). Members are named by :func:`shape_name`. Each is loaded from a file
(:func:`load_from_bundle`): torch's loader takes a path, and given bytes it writes them to a
file itself, after the caller has held the whole package in memory. For a 1 GB package on the
2-core VM that took 11.6-13.9 s against 5.4-6.2 s streamed to a file (2026-12-02).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from engines.backends.aoti.weights import bind, has_weights, read_weights, write_weights
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


def bundle_weights(path: Path, device: str) -> dict[str, Any] | None:
    """The weights the bundle's packages share, on ``device``; None for a bundle whose packages
    hold their own (built before the weights moved out of the libraries)."""
    try:
        stored = has_weights(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"AOTInductor bundle {path} does not read: {exc}") from exc
    return read_weights(path, device) if stored else None


def bundle_names(path: Path) -> set[str]:
    """The shape names the bundle holds a package for, without reading the packages."""
    try:
        with zipfile.ZipFile(path) as z:
            return {n.removesuffix(SUFFIX) for n in z.namelist()
                    if n.endswith(SUFFIX) and "/" not in n}
    except (zipfile.BadZipFile, OSError) as exc:
        raise EngineError(f"AOTInductor bundle {path} does not read: {exc}") from exc


def load_from_bundle(path: Path, name: str, cuda: bool, weights: Mapping[str, Any] | None
                     ) -> Any:
    """One shape's package, streamed from the bundle to a temporary file and loaded from
    there (see the module's note), bound to ``weights`` (:func:`bundle_weights`; the caller
    keeps them alive as long as the package)."""
    with tempfile.NamedTemporaryFile(suffix=SUFFIX) as f:
        try:
            with zipfile.ZipFile(path) as z, z.open(name + SUFFIX) as member:
                shutil.copyfileobj(member, f, 1 << 24)  # the member's CRC is checked at its end
            f.flush()
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise EngineError(f"AOTInductor bundle {path}: package {name} does not read: "
                              f"{exc}") from exc
        package = load_package(Path(f.name), cuda)
    if weights is not None:
        bind(package, weights, f"AOTInductor bundle {path}: package {name}")
    return package


def load_package(path: Path, cuda: bool) -> Any:
    """A package file, loaded ready to call (and to capture in a CUDA graph: single-threaded;
    the runner's lock keeps it so). CUDA packages load without the CPU-ISA probe
    (:func:`skip_cpu_isa_probe`)."""
    import torch

    if cuda:
        _onnxruntime_loaded()
    with skip_cpu_isa_probe() if cuda else contextlib.nullcontext():
        return torch._inductor.aoti_load_package(str(path), run_single_threaded=True)


def _onnxruntime_loaded() -> None:
    """Import onnxruntime (a dependency of the worker in every install) before the first CUDA
    package loads. On the H200 machine (torch 2.11.0+cu130, driver 580, 2026-12-02) every
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
