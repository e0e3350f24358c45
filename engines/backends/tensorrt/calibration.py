"""TensorRT's INT8 calibrator: ``entropy_calibrator`` wraps :class:`engines.calibration
.CalibrationBatches` in a ``tensorrt.IInt8EntropyCalibrator2`` that copies each batch to the
device with cuda-python and keeps a calibration cache file so a rebuild does not re-run
calibration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engines.calibration import CalibrationBatches


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
