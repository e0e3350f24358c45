"""The AOTInductor artifact: one ``.pt2`` package per static shape, stored in one zip.

One file, so the engine cache's SHA-256 covers every package. Stored uncompressed (a package
is itself a zip of compiled code and weights; compressing again gains nothing and costs load
time). Members are named by :func:`shape_name`; each is loaded from memory.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

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
