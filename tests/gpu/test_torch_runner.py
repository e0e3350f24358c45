"""The torch runner on CUDA: graphs per batch size, batches in flight, streams, the cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines.models.open_nsfw import bundled_onnx_path, open_nsfw_spec
from engines.profiles import StaticProfile
from tests.harness.conformance_inputs import conformance_batch

ITEM = (224, 224, 3)


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    x = conformance_batch(n_synthetic=56)
    sess = ort.InferenceSession(str(bundled_onnx_path()), providers=["CPUExecutionProvider"])
    return x, sess.run(["outputs"], {"input:0": x})[0]


def test_one_graph_per_static_size_and_slot(data: tuple[np.ndarray, np.ndarray]) -> None:
    from engines.backends.torch.runner import TorchRunner

    profiles = (StaticProfile("gpu", ITEM, (1, 8, 32)),)
    with TorchRunner(open_nsfw_spec(), profiles=profiles, slots=3) as r:
        assert sorted(size for size, _ in r._slots) == [1, 8, 32]  # keys: (size, item shape)
        assert all(len(v) == 3 for v in r._slots.values())
        assert all(s.graph is not None for v in r._slots.values() for s in v)


def test_many_batches_in_flight_each_get_their_own_outputs(
    data: tuple[np.ndarray, np.ndarray]
) -> None:
    """More batches in flight than slots, on two streams: every result matches its input."""
    import torch

    from engines.backends.torch.runner import TorchRunner

    x, ref = data
    profiles = (StaticProfile("gpu", ITEM, (8,)),)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with TorchRunner(open_nsfw_spec(), profiles=profiles, slots=2) as r:
        handles = []
        for i in range(0, len(x), 8):
            handles.append((i, r.infer({"input:0": x[i:i + 8]}, streams[(i // 8) % 2])))
        for i, h in handles:
            np.testing.assert_allclose(h.result()["outputs"], ref[i:i + 8], atol=1e-2, rtol=0)


def test_accepts_a_cuda_python_stream(data: tuple[np.ndarray, np.ndarray]) -> None:
    from engines.backends.torch.runner import TorchRunner
    from engines.cudart import Stream

    x, ref = data
    stream = Stream()
    profiles = (StaticProfile("gpu", ITEM, (8,)),)
    with TorchRunner(open_nsfw_spec(), profiles=profiles) as r:
        out = r.infer({"input:0": x[:8]}, stream.ptr).result()["outputs"]
    np.testing.assert_allclose(out, ref[:8], atol=1e-2, rtol=0)
    stream.destroy()


def test_buffers_reused_without_growth(data: tuple[np.ndarray, np.ndarray]) -> None:
    """2,000 batches through the same graphs: device memory does not grow, results stay right."""
    import torch

    from engines.backends.torch.runner import TorchRunner

    x, ref = data
    profiles = (StaticProfile("gpu", ITEM, (8,)),)
    with TorchRunner(open_nsfw_spec(), profiles=profiles, slots=2) as r:
        r.infer({"input:0": x[:8]}).result()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        last = None
        for i in range(2000):
            j = (i * 8) % (len(x) - 8)
            h = r.infer({"input:0": x[j:j + 8]})
            if last is not None:
                lj, lh = last
                np.testing.assert_allclose(lh.result()["outputs"], ref[lj:lj + 8], atol=1e-2,
                                           rtol=0)
            last = (j, h)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before


def test_cached_torch_artifact_loads_and_refuses_another_device(tmp_path: Path) -> None:
    from engines.cache import ArtifactMismatch, EngineCache, check_entry
    from engines.device import DeviceFingerprint
    from worker.config import load_config
    from worker.tasks.moderation.models.open_nsfw.engine import (
        engine_loader,
        engine_plan,
        make_runner,
    )

    cfg = load_config(model={"backend": "torch"}, engines={"cache_dir": str(tmp_path)})
    runner, _plan = make_runner(cfg)
    with runner:
        assert runner.engine_hash.startswith("torch-")
    entries = EngineCache(tmp_path).entries()
    assert len(entries) == 1 and entries[0].sidecar["device"]["kind"] == "cuda"
    other = DeviceFingerprint("cuda", "Some Other GPU", "8.0", "550.0", "12.4")
    with pytest.raises(ArtifactMismatch, match="built for cuda"):
        check_entry(entries[0], other, None, verify_bytes=True)
    # Second start: loaded from the cache, not rebuilt.
    built = []
    engine_loader(cfg, engine_plan(cfg), on_build=built.append)()
    assert built == []


def test_a_runner_leaving_sms_free_runs_and_captures_in_its_partition(
    data: tuple[np.ndarray, np.ndarray]
) -> None:
    """Its stream is in a green context of the SMs asked for; its graphs, captured there, give
    the right outputs for a full and a short batch."""
    from cuda.bindings import driver as cu

    from engines.backends.torch.runner import TorchRunner
    from engines.gpu_partition import device_sms

    x, ref = data
    total, _ = device_sms(0)
    profiles = (StaticProfile("gpu", ITEM, (8,)),)
    r = TorchRunner(open_nsfw_spec(), profiles=profiles, slots=2)
    assert r.leave_sms_free(total - 16)
    with r:
        assert r.sm_partition == (16, total)
        err, green = cu.cuStreamGetGreenCtx(r.default_stream.cuda_stream)
        assert int(err) == 0 and int(green) != 0, "the runner's stream is in a green context"
        assert r.graph_count() == 2
        full = r.infer({"input:0": x[:8]}).result()["outputs"]
        short = r.infer({"input:0": x[8:13]}).result()["outputs"]
        np.testing.assert_allclose(full, ref[:8], atol=1e-2, rtol=0)
        np.testing.assert_allclose(short, ref[8:13], atol=1e-2, rtol=0)
