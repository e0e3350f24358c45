"""Weights files (safetensors) as lazy loaders with a checked identity, like ``OnnxFromPath``.

The SHA-256 of the weights is what the engine cache keys exported graphs on, and a pinned
digest refuses a swapped or truncated file instead of scoring with it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from engines.exceptions import ModelChecksumMismatch, ModelNotFound


@dataclass(frozen=True, slots=True)
class Weights:
    path: Path
    sha256: str


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(slots=True)
class WeightsFromPath:
    """Hash a weights file once (cached on the loader) and check it against a pinned digest."""

    path: Path
    expected_sha256: str | None = None
    _done: Weights | None = None

    def __call__(self) -> Weights:
        if self._done is None:
            if not self.path.is_file():
                raise ModelNotFound(f"weights not found at {self.path}")
            digest = sha256_file(self.path)
            if self.expected_sha256 is not None and digest != self.expected_sha256:
                raise ModelChecksumMismatch(
                    f"{self.path} has sha256 {digest}, expected {self.expected_sha256}; the file "
                    "is corrupt or not the model the spec names")
            self._done = Weights(self.path, digest)
        return self._done


def load_safetensors(path: Path) -> dict[str, object]:
    """All tensors of a safetensors file as torch tensors on the CPU (torch imported here)."""
    from safetensors.torch import load_file

    return dict(load_file(str(path), device="cpu"))
