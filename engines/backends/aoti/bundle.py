"""The AOTInductor artifact: one ``.pt2`` package per static shape, stored in one zip.

One file, so the engine cache's SHA-256 covers every package. Stored uncompressed (a package
is itself a zip of compiled code and weights; compressing again gains nothing and costs load
time). Members are named by :func:`shape_name`; each is loaded from memory.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    the runner's lock keeps it so).

    For a CUDA package, the CPU-ISA probe ``aoti_load_package`` runs to fill in the device
    metadata it compares with the package's is skipped (Inductor's ``cpp.vec_isa_ok``): on the
    H200 machine that probe compiled and test-loaded a library per ISA in subprocesses, 36 s
    on the first load in a process, and its result only feeds a warning; the kernels that run
    are GPU kernels, and the cache key already pins the GPU. CPU packages keep the probe: their
    kernels are built for the ISA it finds."""
    import torch

    patch = {"cpp.vec_isa_ok": True} if cuda else {}
    with torch._inductor.config.patch(patch):
        return torch._inductor.aoti_load_package(io.BytesIO(data), run_single_threaded=True)
