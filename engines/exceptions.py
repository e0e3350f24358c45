"""The engines package's exception tree; :class:`EngineError` is its root."""

from __future__ import annotations


class EngineError(Exception):
    """Root of every error raised by the engines package. Fatal unless a subclass says not."""

    recoverable: bool = False


class ModelNotFound(EngineError):
    """A model's weights are not where the spec says (nothing is ever downloaded)."""


class ModelChecksumMismatch(EngineError):
    """A model file's bytes do not match the checksum its package or spec records."""


class BackendUnavailable(EngineError):
    """The backend's library does not import on this machine (e.g. tensorrt without a GPU)."""


class InferenceFailed(EngineError):
    """The runtime rejected or failed a batch; the batch's jobs are answered with status error."""

    recoverable = True


class RunnerStateError(EngineError):
    """A runner was used outside activate()/deactivate()."""
