"""Which decoder prepares a batch: the GPU's, or the CPU's while the GPU's is busy.

With GPU preprocessing the GPU decodes a batch of JPEGs in about the time the compiled engine
takes to run it (H200, 256x256 JPEGs: ~26k img/s decode, ~48k img/s engine), and the two take
turns on the GPU, so at full load the GPU, not the host, sets the rate while most host cores
sit idle. The router sends a batch to the CPU decoder (Pillow on the decode threads) only when
another batch is in the GPU decoder at that moment and fewer than ``cpu_batches`` batches are
being decoded on the CPU. At low load the GPU decoder is free and every batch stays on it; at
full load the share each side takes follows from how fast each one is, with no rate to tune.
Both decoders accept and reject the same images (only complete JPEGs reach the GPU's).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

Decoder = Literal["gpu", "cpu"]


class DecodeRouter:
    def __init__(self, cpu_batches: int) -> None:
        self.cpu_batches = cpu_batches
        self._lock = threading.Lock()
        self._busy: dict[Decoder, int] = {"gpu": 0, "cpu": 0}
        # Batches prepared by each decoder since start (read by the metrics collector).
        self.batches: dict[Decoder, int] = {"gpu": 0, "cpu": 0}

    @contextmanager
    def route(self) -> Iterator[Decoder]:
        """The decoder for one batch, held for as long as the batch is being decoded."""
        with self._lock:
            busy = self._busy
            where: Decoder = ("cpu" if busy["gpu"] and busy["cpu"] < self.cpu_batches
                              else "gpu")
            busy[where] += 1
            self.batches[where] += 1
        try:
            yield where
        finally:
            with self._lock:
                busy[where] -= 1
