"""The runner interface shared by the onnxruntime, torch and TensorRT backends.

``infer`` only enqueues work on the caller's stream and returns at once; the handle's
``result()`` waits until the outputs are on the host. On the CPU backend a "stream" is a
single-thread executor; on CUDA backends it is a CUDA stream. Two handles serve every backend:
:class:`FutureHandle` over an executor's future, :class:`EventHandle` over a recorded CUDA event.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Protocol, Self

import numpy as np

from engines.exceptions import InferenceFailed, RunnerStateError

Outputs = dict[str, np.ndarray]


class InferHandle(Protocol):
    def done(self) -> bool: ...

    def result(self, timeout: float | None = None) -> Outputs: ...


class FutureHandle:
    """An :class:`InferHandle` over a ``concurrent.futures.Future``; wraps runtime errors."""

    __slots__ = ("_future",)

    def __init__(self, future: Future[Outputs]) -> None:
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> Outputs:
        try:
            return self._future.result(timeout)
        except InferenceFailed:
            raise
        except (RuntimeError, ValueError) as exc:
            raise InferenceFailed(f"inference failed: {exc}") from exc


class EventHandle:
    """An :class:`InferHandle` over a CUDA event recorded after the device-to-host copy.

    ``result()`` waits for that event only, then copies the first ``n`` rows (all without
    ``n``) out of the pinned host output, which is anything with ``numpy()`` (a pinned torch
    tensor, a :class:`engines.cudart.PinnedBuffer`). ``keepalive`` holds host inputs of an
    asynchronous copy until the outputs were read.
    """

    __slots__ = ("_event", "_host_out", "_keepalive", "_n", "_name", "_value")

    def __init__(self, event: Any, host_out: Any, name: str, n: int | None = None,
                 keepalive: Any = None) -> None:
        self._event, self._host_out, self._name, self._n = event, host_out, name, n
        self._keepalive = keepalive
        self._value: Outputs | None = None

    def done(self) -> bool:
        return self._value is not None or bool(self._event.query())

    def result(self, timeout: float | None = None) -> Outputs:
        if self._value is None:
            self._event.synchronize()
            out = self._host_out.numpy()
            self._value = {self._name: np.array(out if self._n is None else out[: self._n],
                                                copy=True)}
            self._keepalive = None
        return self._value


class Runner(abc.ABC):
    """Base runner: subclasses implement ``_activate``, ``_infer`` and ``_deactivate`` and set
    ``_hash`` when they load their artifact."""

    backend: str = "abstract"

    def __init__(self) -> None:
        self._active = False
        self._hash = ""

    @property
    def active(self) -> bool:
        return self._active

    @property
    def engine_hash(self) -> str:
        """A short identity of the loaded artifact (model bytes + backend and version)."""
        return self._hash

    def activate(self) -> None:
        if not self._active:
            try:
                self._activate()
            except BaseException as exc:
                self._undo_activate(exc)
                raise
            self._active = True

    def _undo_activate(self, cause: BaseException) -> None:
        """Release what a failed activation got before it failed (a loaded engine, device
        memory, streams), so that nothing is kept for a retry to reuse. Every ``_deactivate``
        takes a partial state; one that fails here notes it on ``cause``, which goes on."""
        try:
            self._deactivate()
        except Exception as exc:  # noqa: BLE001 - the activation's own error is the one raised
            cause.add_note(f"releasing the failed activation also failed: {exc!r}")

    def deactivate(self) -> None:
        if self._active:
            try:
                self._deactivate()
            finally:
                self._active = False

    def leave_sms_free(self, sms: int) -> bool:
        """Before activation: keep this runner's kernels off at least ``sms`` of the device's
        SMs, for another task's kernels in the same process. False where the backend cannot
        (the default; the torch and aoti runners on CUDA can)."""
        return False

    def use_free_sms(self, sms: int) -> bool:
        """Before activation: run this runner's kernels only on the SMs that runners which
        left ``sms`` free leave, so the two never share one. False where the backend cannot
        (the default; the torch and aoti runners on CUDA can)."""
        return False

    def infer(self, feeds: Mapping[str, np.ndarray], stream: Any = None) -> InferHandle:
        if not self._active:
            raise RunnerStateError(f"{type(self).__name__}.infer() called before activate()")
        return self._infer(feeds, stream)

    def __enter__(self) -> Self:
        self.activate()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.deactivate()

    @abc.abstractmethod
    def _activate(self) -> None: ...

    @abc.abstractmethod
    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle: ...

    @abc.abstractmethod
    def _deactivate(self) -> None: ...
