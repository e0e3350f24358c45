"""The packages' weights, kept out of the compiled libraries and stored once per bundle.

Packages are compiled with ``aot_inductor.package_constants_in_so = False``: each holds the
kernels and no weights, and the weights are bound at load with ``load_constants(...,
user_managed=True)`` (the package keeps pointers to the caller's tensors). So all the shapes of
a bundle share one copy on the device, and a load reads the weights straight from the bundle
into device memory. With the weights inside the library, torch extracts every package to a
temporary directory and loads the library's weights itself: the SD UNet's 1.73 GB package took
5.0 s to load on the H200 (10.6 s as the first load in a process).

Two stored (uncompressed) members of the bundle:

- ``weights.json``: per constant, its dtype, shape, strides and byte range in the blob;
- ``weights.bin``: the constants' bytes in their memory order (channels-last stays
  channels-last: the compiled kernels index the strides they were compiled for), each at an
  offset aligned to :data:`ALIGN` bytes.

Our own format, not safetensors: safetensors stores no strides, and its readers take a file of
their own, not a byte range inside the bundle (the engine cache keeps one artifact file, so one
SHA-256 covers the packages and their weights). The blob is read from its offset in the bundle
in chunks through two pinned host buffers, each chunk's copy to the device overlapping the next
read. Its CRC is not checked on this path: the engine cache has verified the artifact's SHA-256
(``trt-worker engines verify`` hashes it again). Runners get their copy through
:func:`engines.backends.aoti.kept.shared_weights` (torch releases that never release weights
bound by reference).
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engines.exceptions import EngineError

INDEX, BLOB = "weights.json", "weights.bin"
ALIGN = 256  # bytes; above what the compiled kernels assume for a tensor's start (16)
CHUNK = 64 << 20  # bytes per read into a pinned buffer
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip member's local file header (30 bytes)


def write_weights(z: zipfile.ZipFile, tensors: Mapping[str, Any]) -> None:
    """Store ``tensors`` (name -> tensor, any device) in the open bundle ``z``."""
    import torch

    index: dict[str, dict[str, Any]] = {}
    with z.open(BLOB, "w", force_zip64=True) as blob:
        offset = 0
        for name in sorted(tensors):
            t = tensors[name].detach().to("cpu")
            dense = t.clone(memory_format=torch.preserve_format)
            if dense.stride() != t.stride():
                raise EngineError(f"weight {name!r} is not dense (strides {t.stride()}); "
                                  "it cannot be stored with its layout")
            data = dense.as_strided((dense.numel(),), (1,)).view(torch.uint8).numpy()
            pad = -offset % ALIGN
            blob.write(b"\0" * pad)
            offset += pad
            index[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                           "stride": list(t.stride()), "offset": offset, "nbytes": data.nbytes}
            blob.write(memoryview(data))
            offset += data.nbytes
        blob.write(b"\0" * (-offset % ALIGN))  # every dtype's view of the blob is whole
    z.writestr(INDEX, json.dumps({"align": ALIGN, "tensors": index}))


def read_weights(path: Path, device: str) -> dict[str, Any]:
    """The bundle's weights on ``device``: views of one buffer holding the whole blob."""
    try:
        return _read_weights(path, device)
    except EngineError as exc:
        raise EngineError(f"AOTInductor bundle {path}: {exc}") from exc
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, TypeError, AttributeError,
            RuntimeError) as exc:  # a damaged index, a short file, no device memory
        raise EngineError(f"AOTInductor bundle {path}: the weights do not read: "
                          f"{type(exc).__name__}: {exc}") from exc


def _read_weights(path: Path, device: str) -> dict[str, Any]:
    import torch

    with zipfile.ZipFile(path) as z:
        if INDEX not in z.namelist():
            raise EngineError("no weights: built before the packages left them out; rebuild "
                              "the engine")
        index = json.loads(z.read(INDEX))["tensors"]
        info = z.getinfo(BLOB)
    if info.compress_type != zipfile.ZIP_STORED:
        raise EngineError(f"{BLOB} is compressed")
    with open(path, "rb", buffering=0) as f:
        start = _data_offset(f, info)
        blob = torch.empty(info.file_size, dtype=torch.uint8, device=device)
        if blob.is_cuda:
            with torch.cuda.device(blob.device):  # its streams and events, not the current's
                _read_to_cuda(f, start, blob)
        else:
            f.seek(start)
            _read_into(f, _bytes_of(blob))
    out = {}
    for name, t in index.items():
        dtype = getattr(torch, t["dtype"])
        size = dtype.itemsize
        if t["offset"] % size or t["offset"] + t["nbytes"] > blob.numel():
            raise EngineError(f"weight {name!r} lies outside the blob ({blob.numel()} bytes); "
                              "rebuild the engine")
        out[name] = blob.view(dtype).as_strided(t["shape"], t["stride"], t["offset"] // size)
    return out


def _data_offset(f: Any, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header, whose name and extra field
    lengths may differ from the central directory's."""
    f.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if fields[0] != 0x04034B50:
        raise EngineError(f"{info.filename}: no local file header at {info.header_offset}")
    return int(info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10])


def _bytes_of(t: Any) -> memoryview:
    """A uint8 CPU tensor's memory, writable in place."""
    return memoryview(t.numpy()).cast("B")


def _read_into(f: Any, view: memoryview) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise EngineError(f"the weights end {len(view) - done} bytes early")
        done += n


def _read_to_cuda(f: Any, start: int, blob: Any) -> None:
    """Read into two pinned buffers in turn; each buffer's copy to the device runs on the
    current stream while the other one is read."""
    import torch

    f.seek(start)
    bufs = [torch.empty(min(CHUNK, blob.numel()), dtype=torch.uint8, pin_memory=True)
            for _ in range(2)]
    copied: list[Any] = [None, None]
    for i, at in enumerate(range(0, blob.numel(), CHUNK)):
        n = min(CHUNK, blob.numel() - at)
        k = i % 2
        if copied[k] is not None:
            copied[k].synchronize()  # that buffer's last copy is done
        _read_into(f, _bytes_of(bufs[k])[:n])
        blob[at:at + n].copy_(bufs[k][:n], non_blocking=True)
        copied[k] = torch.cuda.Event()  # type: ignore[no-untyped-call]
        copied[k].record()
    torch.cuda.current_stream().synchronize()


def bind(package: Any, weights: Mapping[str, Any], where: str) -> None:
    """Give a package built without its weights the constants it names (by reference: the
    caller keeps ``weights`` alive as long as the package)."""
    wanted = package.get_constant_fqns()
    missing = sorted(set(wanted) - set(weights))
    if missing:
        # Parameters and buffers keep their names through export and compile; a tensor
        # literal in ``forward`` larger than Inductor inlines (``torch.tensor([...])`` of more
        # than 8 values) becomes a constant named by Inductor (``_tensor_constant0``) that
        # the exported program calls something else, so it cannot be stored by name.
        raise EngineError(f"{where}: the package needs {len(missing)} constants that are not "
                          f"the network's parameters or buffers, e.g. {missing[:3]} (a tensor "
                          "literal in forward? register it as a buffer)")
    try:
        package.load_constants({k: weights[k] for k in wanted}, check_full_update=True,
                               user_managed=True)
    except (RuntimeError, TypeError) as exc:
        raise EngineError(f"{where}: binding the weights failed: {exc}") from exc
