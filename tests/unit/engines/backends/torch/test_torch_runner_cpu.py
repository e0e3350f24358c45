"""The torch backend's pure parts and its CPU mode (CUDA graphs: tests/gpu)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from engines.backends.base import EventHandle
from engines.backends.torch.graphs import sample_input
from engines.backends.torch.runner import TorchRunner, graph_shapes
from engines.exceptions import BackendUnavailable, InferenceFailed
from engines.loaders import OnnxModel
from engines.profiles import StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec


def _no_onnx() -> OnnxModel:
    raise AssertionError("the torch runner never reads ONNX")


TEXT = EngineSpec("text", _no_onnx, (TensorSpec("input_ids", (-1, -1), "int64"),
                                     TensorSpec("attention_mask", (-1, -1), "int64")),
                  (TensorSpec("embedding", (-1, 4)),))
UNET = EngineSpec("unet", _no_onnx, (TensorSpec("sample", (-1, 4, -1, -1)),
                                     TensorSpec("timestep", (-1,)),
                                     TensorSpec("encoder_hidden_states", (-1, 77, 32))),
                  (TensorSpec("noise_pred", (-1, 4, -1, -1)),))


def test_graph_shapes_take_open_dims_from_the_item_and_the_rest_from_the_spec() -> None:
    assert graph_shapes(TEXT, (8, (32,))) == [(8, 32), (8, 32)]  # the mask follows the ids
    assert graph_shapes(UNET, (2, (4, 8, 16))) == [(2, 4, 8, 16), (2,), (2, 77, 32)]


def test_capture_samples_are_valid_ids_and_finite_floats() -> None:
    assert (sample_input("int64", (2, 3)) == 1).all()
    t = sample_input("float32", (4,))
    assert t.dtype == np.float32 and np.isfinite(t).all() and np.abs(t).max() > 10


class _Event:
    def __init__(self) -> None:
        self.synced = 0

    def query(self) -> bool:
        return self.synced > 0

    def synchronize(self) -> None:
        self.synced += 1


class _Host:
    """A pinned buffer stand-in: anything with numpy()."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def numpy(self) -> np.ndarray:
        return self.array


def test_event_handle_waits_once_and_copies_the_first_rows() -> None:
    event, host = _Event(), _Host(np.arange(8, dtype=np.float32).reshape(4, 2))
    handle = EventHandle(event, host, "out", n=3, keepalive=["input"])
    assert not handle.done()
    first = handle.result()["out"]
    host.array[...] = -1  # the slot is reused: the result must not change
    assert handle.done() and event.synced == 1
    np.testing.assert_array_equal(first, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert handle.result()["out"] is first and event.synced == 1
    assert EventHandle(_Event(), host, "out").result()["out"].shape == (4, 2)


torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


class _Sum(torch.nn.Module):  # type: ignore[misc]
    """embedding = the masked sum of the ids, four times (any int inputs -> float32 [N, 4])."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, ids: Any, mask: Any) -> Any:
        return (ids * mask).sum(dim=1, keepdim=True).float() * self.scale


def _spec(net: Any = None) -> EngineSpec:
    return dataclasses.replace(TEXT, native=NativeNet(lambda device: (net or _Sum(), "d" * 64)))


def _feeds(n: int, length: int = 8) -> dict[str, np.ndarray]:
    ids = np.arange(n * length, dtype=np.int64).reshape(n, length)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def test_cpu_mode_runs_the_specs_network_in_fp32() -> None:
    profiles = (StaticProfile("tok8", (8,), (1, 4)),)
    with TorchRunner(_spec(), profiles=profiles, precision="fp32", device="cpu") as runner:
        got = runner.infer(_feeds(3)).result()["embedding"]
        assert runner.engine_hash == f"torch-{torch.__version__}-fp32-dddddddddddd"
        assert runner.graph_keys == [] and runner.graph_count() == 0  # no graphs on the CPU
        with pytest.raises(InferenceFailed, match="exceeds every profile"):
            runner.infer(_feeds(5))
        with pytest.raises(InferenceFailed, match="missing input"):
            runner.infer({"input_ids": _feeds(1)["input_ids"]})
    want = _feeds(3)["input_ids"].sum(axis=1, keepdims=True).astype(np.float32)
    np.testing.assert_array_equal(got, np.repeat(want, 4, axis=1))


def test_refusals() -> None:
    with pytest.raises(BackendUnavailable, match="not int8"):
        TorchRunner(_spec(), precision="int8")
    with pytest.raises(BackendUnavailable, match="fp32 only"):
        TorchRunner(_spec(), precision="fp16", device="cpu").activate()
    with pytest.raises(BackendUnavailable, match="no native network"):
        TorchRunner(TEXT, precision="fp32", device="cpu").activate()


def test_graph_batches_limit_which_static_shapes_get_graphs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With graph_batches set, a batch whose smallest holding shape is left out runs eagerly:
    no graph is captured for it, at activate or while serving."""
    item = (4,)
    runner = TorchRunner(TEXT, profiles=(StaticProfile("p", item, (8, 32, 128)),),
                         device="cuda:0")
    captured: list[tuple[int, tuple[int, ...]]] = []

    def capture(key: Any) -> bool:  # the CUDA capture itself is tests/gpu's
        captured.append(key)
        return False

    monkeypatch.setattr(runner, "_capture", capture)

    def batch(n: int) -> list[np.ndarray]:
        return [np.ones((n, *item), dtype=np.int64)]

    runner.graph_batches = frozenset({8})
    assert runner._slot_for(batch(20)) is None and captured == []  # 32 is left out: eager
    assert runner._slot_for(batch(5)) is None and captured == [(8, item)]  # 8 may have one
    runner.graph_batches = None
    captured.clear()
    runner._slot_for(batch(20))
    assert captured == [(32, item)]


def test_sms_are_left_free_on_cuda_only_and_before_activation() -> None:
    from engines.exceptions import RunnerStateError

    cpu = TorchRunner(_spec(), precision="fp32", device="cpu")
    assert cpu.leave_sms_free(16) is False  # nothing to partition on the CPU
    cuda = TorchRunner(_spec(), device="cuda:0")
    assert cuda.leave_sms_free(16) is True and cuda._free_sms == 16  # (applied in _start)
    with (TorchRunner(_spec(), precision="fp32", device="cpu") as active,
          pytest.raises(RunnerStateError, match="before activation")):
        active.leave_sms_free(16)


class _FakeCuda:
    """torch.cuda's stream constructors, recorded (no CUDA device here)."""

    class Stream:
        def __init__(self, device: Any = None) -> None:
            self.device, self.cuda_stream = device, 1

        def synchronize(self) -> None: ...

    class ExternalStream(Stream):
        def __init__(self, ptr: int, device: Any = None) -> None:
            super().__init__(device)
            self.cuda_stream = ptr


class _FakePartition:
    sms, total = 112, 132

    def __init__(self) -> None:
        self.released: list[int] = []

    def stream(self) -> int:
        return 4242

    def release(self, ptr: int) -> None:
        self.released.append(ptr)


def test_a_partitioned_runner_runs_and_captures_on_its_partitions_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from engines import gpu_partition
    from engines.backends.torch import runner as runner_module

    part = _FakePartition()
    monkeypatch.setattr(runner_module, "cuda_module", lambda: _FakeCuda)
    monkeypatch.setattr(gpu_partition, "shared_partition", lambda leave, device: part)
    r = TorchRunner(_spec(), device="cuda:0", cuda_graphs=False)
    r.leave_sms_free(16)
    r._start()
    assert isinstance(r._stream, _FakeCuda.ExternalStream) and r._stream.cuda_stream == 4242
    assert r._capture_on is r._stream and r.sm_partition == (112, 132)
    r._deactivate()
    assert part.released == [4242]  # its stream goes back with the engine


def test_a_runner_on_the_free_sms_runs_on_the_rest_of_the_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """use_free_sms: its stream comes from the green context of the SMs that the partition
    leaving them makes (shared_rest), never from that partition itself."""
    from engines import gpu_partition
    from engines.backends.torch import runner as runner_module

    rest = _FakePartition()
    monkeypatch.setattr(runner_module, "cuda_module", lambda: _FakeCuda)
    monkeypatch.setattr(gpu_partition, "shared_rest", lambda leave, device: rest)
    monkeypatch.setattr(gpu_partition, "shared_partition",
                        lambda leave, device: pytest.fail("the partition itself was asked for"))
    r = TorchRunner(_spec(), device="cuda:0", cuda_graphs=False)
    assert r.use_free_sms(16)
    r._start()
    assert r._stream.cuda_stream == 4242 and r._capture_on is r._stream
    r._deactivate()
    assert rest.released == [4242]


def test_a_runner_on_the_cpu_has_no_sms_to_keep_to() -> None:
    r = TorchRunner(_spec(), device="cpu", cuda_graphs=False)
    assert not r.use_free_sms(16) and not r.leave_sms_free(16)


def test_a_partition_the_driver_refuses_leaves_the_engine_on_every_sm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from engines import gpu_partition
    from engines.backends.torch import runner as runner_module
    from engines.exceptions import EngineError

    def refuse(leave: int, device: int) -> Any:
        raise EngineError("cuGreenCtxCreate: CUDA driver error CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(runner_module, "cuda_module", lambda: _FakeCuda)
    monkeypatch.setattr(gpu_partition, "shared_partition", refuse)
    r = TorchRunner(_spec(), device="cuda:0", cuda_graphs=False)
    r.leave_sms_free(16)
    r._start()  # no exception: the engine starts
    assert type(r._stream) is _FakeCuda.Stream and r._capture_on is None
    assert r.sm_partition is None and "NOT_SUPPORTED" in (r.partition_error or "")
