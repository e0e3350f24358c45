"""INT8 calibration data: real samples, batched exactly as the engine will see them.

``CalibrationBatches`` is pure numpy (tested without TensorRT); ``entropy_calibrator`` wraps it
in a ``tensorrt.IInt8EntropyCalibrator2`` that copies each batch to the device with cuda-python
and keeps a calibration cache file so a rebuild does not re-run calibration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np


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


def samples_from_folder(folder: Path, preprocess: Callable[[bytes], np.ndarray]
                        ) -> Iterator[np.ndarray]:
    """Preprocessed samples from the images of a folder (sorted, for reproducible builds)."""
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp"):
            yield preprocess(path.read_bytes())


def entropy_calibrator(batches: CalibrationBatches, input_name: str, cache_file: Path) -> Any:
    """A ``tensorrt.IInt8EntropyCalibrator2`` over ``batches`` (needs tensorrt + cuda-python)."""
    import tensorrt as trt

    from engines.cudart import DeviceBuffer, check, runtime

    class _Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._it = iter(batches)
            nbytes = batches.batch_size * int(np.prod(batches.item_shape)) * 4
            self._dev = DeviceBuffer(nbytes)

        def get_batch_size(self) -> int:
            return batches.batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = next(self._it, None)
            if batch is None:
                return None
            rt = runtime()
            check(rt.cudaMemcpy(self._dev.ptr, batch.ctypes.data, batch.nbytes,
                                rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
            return [self._dev.ptr if n == input_name else 0 for n in names]

        def read_calibration_cache(self) -> bytes | None:
            return cache_file.read_bytes() if cache_file.is_file() else None

        def write_calibration_cache(self, cache: Any) -> None:
            cache_file.write_bytes(bytes(cache))

    return _Calibrator()
