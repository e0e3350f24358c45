"""Small lazy loaders: each holds what it needs and does its work only when called.

They chain like Polygraphy's (``OnnxFromPath`` -> build -> save): a runner takes a loader and
calls it in ``activate()``, so constructing a runner touches neither disk nor device.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from engines.exceptions import ModelChecksumMismatch, ModelNotFound


@dataclass(frozen=True, slots=True)
class OnnxModel:
    """ONNX bytes and their SHA-256, the identity the engine cache keys on."""

    data: bytes
    sha256: str
    source: str


@dataclass(frozen=True, slots=True)
class OnnxFromPath:
    """Read an ONNX file; optionally verify its SHA-256 against a known value."""

    path: Path
    expected_sha256: str | None = None

    def __call__(self) -> OnnxModel:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError as exc:
            raise ModelNotFound(f"ONNX model not found at {self.path}") from exc
        digest = hashlib.sha256(data).hexdigest()
        if self.expected_sha256 is not None and digest != self.expected_sha256:
            raise ModelChecksumMismatch(
                f"{self.path} has sha256 {digest}, expected {self.expected_sha256}; "
                "the file is corrupt or not the model the spec names"
            )
        return OnnxModel(data=data, sha256=digest, source=str(self.path))
