"""The pipeline's streams on the free SMs (processing.gpu_disjoint_sms), without a GPU: the
driver's refusal of a stream in the green context leaves the pipeline on every SM."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from engines import gpu_partition
from engines.backends.torch import pipeline as pipeline_module
from engines.backends.torch.pipeline import TorchPipeline
from engines.exceptions import EngineError


class _Stream:
    def __init__(self, *, urgent: bool = False, adopt: int | None = None,
                 destroy: Any = None) -> None:
        self.urgent, self.adopt, self.destroy = urgent, adopt, destroy


class _Rest:
    """A green context that makes ``refuse_after`` streams, then refuses."""

    def __init__(self, refuse_after: int = 3) -> None:
        self.sms, self.total = 20, 132
        self.refuse_after = refuse_after
        self.made: list[int] = []
        self.released: list[int] = []

    def stream(self, priority: int = 0) -> int:
        if len(self.made) == self.refuse_after:
            raise EngineError("cuGreenCtxStreamCreate: CUDA_ERROR_OUT_OF_RESOURCES")
        ptr = 1000 + len(self.made)
        self.made.append(ptr)
        return ptr

    def release(self, ptr: int) -> None:
        self.released.append(ptr)


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> TorchPipeline:
    monkeypatch.setattr(pipeline_module, "Stream", _Stream)
    runner = SimpleNamespace(device="cuda:0", spec=SimpleNamespace(model_id="open_nsfw"))
    made = TorchPipeline(runner, (1, 8))  # type: ignore[arg-type]
    made.on_free_sms = 16
    return made


def test_streams_on_the_free_sms_are_the_rests_own(
        pipe: TorchPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    rest = _Rest()
    monkeypatch.setattr(gpu_partition, "shared_rest", lambda leave, device: rest)
    streams = pipe._streams()
    assert [s.adopt for s in streams] == rest.made  # type: ignore[attr-defined]
    assert pipe.partition is rest and pipe.partition_error is None


def test_a_stream_the_driver_refuses_leaves_the_pipeline_on_every_sm(
        pipe: TorchPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    rest = _Rest(refuse_after=1)
    monkeypatch.setattr(gpu_partition, "shared_rest", lambda leave, device: rest)
    streams = pipe._streams()
    assert len(streams) == 3 and all(s.adopt is None for s in streams)  # type: ignore[attr-defined]
    assert pipe.partition is None and "OUT_OF_RESOURCES" in (pipe.partition_error or "")
    assert rest.released == rest.made == [1000]  # the one it made goes back to the context


def test_a_context_the_driver_refuses_leaves_the_pipeline_on_every_sm(
        pipe: TorchPipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(leave: int, device: int) -> Any:
        raise EngineError("cuGreenCtxCreate: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(gpu_partition, "shared_rest", refuse)
    streams = pipe._streams()
    assert all(s.adopt is None for s in streams)  # type: ignore[attr-defined]
    assert pipe.partition is None and "NOT_SUPPORTED" in (pipe.partition_error or "")
