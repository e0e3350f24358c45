"""INT8 calibration data shared by the backends that quantize (TensorRT, ONNX Runtime): real
sample images, preprocessed as the worker preprocesses a job's image, batched as an engine sees
them, and a fingerprint of the set that the engine cache keys int8 artifacts on. Pure numpy."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from engines.cache import sha256_file
from engines.exceptions import EngineError


class CalibrationBatches:
    """Fixed-size float32 batches from ``samples`` (each already preprocessed to ``item_shape``).

    The last partial batch is dropped: TensorRT calibrates on a fixed batch size, and a padded
    batch would skew the activation histograms with filler values.
    """

    def __init__(self, samples: Iterable[np.ndarray], batch_size: int,
                 item_shape: tuple[int, ...], max_batches: int | None = None) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.samples, self.batch_size, self.item_shape = samples, batch_size, item_shape
        self.max_batches = max_batches

    def __iter__(self) -> Iterator[np.ndarray]:
        buf: list[np.ndarray] = []
        produced = 0
        for s in self.samples:
            if s.shape != self.item_shape:
                raise ValueError(f"calibration sample of shape {s.shape}, expected "
                                 f"{self.item_shape}")
            buf.append(s.astype(np.float32, copy=False))
            if len(buf) == self.batch_size:
                yield np.ascontiguousarray(np.stack(buf))
                buf.clear()
                produced += 1
                if self.max_batches is not None and produced >= self.max_batches:
                    return


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def calibration_images(folder: Path) -> list[Path]:
    """The images of a calibration folder, sorted (reproducible builds)."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def samples_from_folder(folder: Path, preprocess: Callable[[bytes], np.ndarray]
                        ) -> Iterator[np.ndarray]:
    """Preprocessed samples from the images of a folder (sorted, for reproducible builds)."""
    for path in calibration_images(folder):
        yield preprocess(path.read_bytes())


def calibration_fingerprint(folder: Path) -> str:
    """SHA-256 over the names and bytes of a calibration folder's images (not its path): an
    artifact calibrated on them is keyed on it, so another calibration set builds anew."""
    if not folder.is_dir():
        raise EngineError(f"calibration folder {folder} (engines.calibration_dir) is not a "
                          "directory")
    images = calibration_images(folder)
    if not images:
        raise EngineError(f"calibration folder {folder} (engines.calibration_dir) holds no "
                          f"images ({', '.join(IMAGE_SUFFIXES)})")
    digest = hashlib.sha256()
    for path in images:
        digest.update(f"{path.name}\0{sha256_file(path)}\0".encode())
    return digest.hexdigest()
