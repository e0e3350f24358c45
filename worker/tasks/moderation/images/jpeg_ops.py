"""torchvision's JPEG decoders (nvJPEG batched on CUDA, libjpeg-turbo on the CPU) without
importing torchvision.

``import torchvision`` imports its models, datasets, ops and, through them, torch._dynamo: it
took 5-11 s of a GPU worker's 12 s warm start on the H200 (py-spy), for two
operators. Both live in torchvision's image extension library, which is loaded here by path
with ``torch.ops.load_library``, as torchvision itself loads it. Where that library cannot be
found or loaded (another layout, a future torchvision), the decoders come from
``torchvision.io`` as before: slower to import, same results.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

RGB = 3  # torchvision.io.ImageReadMode.RGB
DECODERS = ("decode_jpegs_cuda", "decode_jpeg")  # the operators this module calls
_lock = threading.Lock()
_ops: Any = None


def image_library() -> Path | None:
    """The path of torchvision's image extension library, or None (torchvision missing or laid
    out otherwise). Found without importing torchvision."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in map(Path, spec.submodule_search_locations):
        # image.so up to torchvision 0.2x, image_stable.so in the stable-ABI builds after it.
        libs = sorted(folder.glob("image*.so")) + sorted(folder.glob("image*.pyd"))
        if libs:
            return libs[0]
    return None


def _load() -> Any:
    """``torch.ops.image`` with the decoders registered (loaded once per process)."""
    global _ops
    with _lock:
        if _ops is None:
            import torch

            ops: Any = torch.ops  # (its load_library is unannotated)
            lib = image_library()
            if lib is not None:
                try:
                    ops.load_library(str(lib))
                except (OSError, RuntimeError):
                    lib = None
            if lib is None or not all(hasattr(ops.image, name) for name in DECODERS):
                import torchvision.io  # noqa: F401  (registers the same operators, slowly)
            _ops = ops.image
    return _ops


def decode_jpegs(datas: list[Any], device: Any) -> list[Any]:
    """RGB uint8 [3, H, W] tensors on ``device`` for JPEG byte tensors (uint8, CPU): one
    batched nvJPEG call on CUDA, one libjpeg-turbo call per image on the CPU (like
    ``torchvision.io.decode_jpeg(datas, mode=RGB, device=device)``). Raises RuntimeError
    when a file does not decode (on CUDA: the whole batch)."""
    ops = _load()
    if device.type == "cuda":
        return list(ops.decode_jpegs_cuda(datas, RGB, device))
    return [ops.decode_jpeg(t, RGB, False) for t in datas]
