"""One copy of an engine's weights per process, where torch never releases them.

torch releases before pytorch/pytorch#194480 (torch 2.11 on the H200 among them) never
let go of a tensor bound by reference: their AOTInductor runtime, compiled into every package,
makes a handle for each such constant and never deletes it, so the weights' storage outlives
the package. On those, :func:`shared_weights` reads a bundle's weights once per process per
artifact file and device, and every later load (the build's check, then each activation of a
runner) binds the same copy; otherwise each activation of a runner would add a copy (measured
on the H200: one weights' worth of device memory per activate/deactivate cycle).
"""

from __future__ import annotations

import functools
import logging
import threading
from pathlib import Path
from typing import Any

from engines.backends.aoti.weights import read_weights
from engines.exceptions import EngineError

log = logging.getLogger("engines")

# The runtime header whose class held user-managed constants without owning the handle it made.
RUNTIME_HEADER = "include/torch/csrc/inductor/aoti_runtime/utils.h"
_LEAKY_RUNTIME = "class MaybeOwningAtenTensorHandle"
# Weights kept for the life of the process on such a runtime, by artifact file and device. Never
# evicted: the runtime holds their storage anyway. Shared by every runner of that artifact,
# which is sound because nothing writes to weights after the build.
_kept: dict[tuple[int, int, int, int, str], dict[str, Any]] = {}
_kept_lock = threading.Lock()


def shared_weights(path: Path, device: str) -> dict[str, Any]:
    """The bundle's weights on ``device`` for binding by reference: read afresh where the
    packages release what they are bound to, else the process's one copy of that file."""
    if not runtime_keeps_bindings():
        return read_weights(path, device)
    try:
        st = path.stat()
    except OSError as exc:
        raise EngineError(f"AOTInductor bundle {path}: {exc}") from exc
    # The file, not its path: the engine cache moves a built artifact into place by renaming
    # its folder, which keeps device, inode, size and mtime (not ctime), so a worker that built
    # its engine binds the copy the build checked.
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, _device_name(device))
    with _kept_lock:
        kept = _kept.get(key)
    if kept is None:  # read outside the lock: other engines' loads go on meanwhile
        fresh = read_weights(path, device)
        with _kept_lock:
            kept = _kept.setdefault(key, fresh)  # a concurrent read of the same file: one wins
    return kept


def _device_name(device: str) -> str:
    """One name per device: "cuda" is the current CUDA device at the time of the read."""
    import torch

    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return str(d)


@functools.cache
def runtime_keeps_bindings() -> bool:
    """Whether the installed torch's AOTInductor runtime (what its packages are compiled with:
    the engine cache keys on the torch version) keeps tensors bound by reference forever."""
    import torch

    return keeps_bindings(Path(torch.__file__).parent / RUNTIME_HEADER)


def keeps_bindings(header: Path) -> bool:
    """From the runtime's header; without it, assume so (the cost is memory, not results)."""
    try:
        return _LEAKY_RUNTIME in header.read_text(errors="replace")
    except OSError:
        log.warning("aoti_runtime_header_missing: %s; assuming the runtime keeps weights bound "
                    "by reference (one copy per engine per process)", header)
        return True
