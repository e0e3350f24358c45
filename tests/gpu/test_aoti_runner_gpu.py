"""An aoti runner on the GPU adds no copy of its weights per activation.

The packages are bound to the bundle's weights by reference (``user_managed=True``). torch
releases before pytorch/pytorch#194480 never release such bindings, so without
``engines.backends.aoti.kept.shared_weights`` every activate/deactivate cycle left one copy
of the weights on the device (this test on the H200, torch 2.11: 2,103,808 bytes
more per cycle for 2,103,300 bytes of weights).

torch keeps a cuBLAS workspace (32 MiB on the H200) for every stream that ran a matmul, until it
is told to drop them, and each activation makes new streams, so the measurement drops them
first (found on the H200: 71 MB more per cycle without that; a new stream and one
matmul alone: 33.5 MB).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.assembly import EngineParams, EnginePlan
from engines.loaders import OnnxModel
from engines.profiles import StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")

WIDTH = 1024  # a 2 MiB fp16 weight: a copy left behind shows in memory_allocated


class _Wide(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(WIDTH, WIDTH)
        self.out = torch.nn.Linear(WIDTH, 2)

    def forward(self, x: Any) -> Any:
        x = x.to(self.fc.weight.dtype)
        return torch.softmax(self.out(torch.relu(self.fc(x))), dim=1).float()


def _plan(cache: Path) -> EnginePlan:
    spec = EngineSpec("wide", lambda: OnnxModel(b"", "0" * 64, "no onnx"),
                      (TensorSpec("x", (-1, WIDTH)),), (TensorSpec("p", (-1, 2)),),
                      native=NativeNet(lambda device: (_Wide().to(device), "b" * 64)))
    return EnginePlan(spec, (StaticProfile("p", (WIDTH,), (1, 4)),),
                      EngineParams(backend="aoti", precision="fp16", device="cuda:0",
                                   cache_dir=cache, autotune=False))


def _allocated() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()  # nothing else runs: the streams are gone
    return int(torch.cuda.memory_allocated())


def test_activate_deactivate_cycles_leave_no_weights_behind(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.loader()()  # build once (compiles two shapes: a minute or two)
    x = np.random.default_rng(0).standard_normal((3, WIDTH)).astype(np.float32)
    want = _Wide().eval()(torch.from_numpy(x)).detach().numpy()
    after: list[int] = []
    for _ in range(3):
        with plan.runner() as runner:
            got = runner.infer({"x": x}).result()["p"]
            np.testing.assert_allclose(got, want, atol=2e-2, rtol=0)
        after.append(_allocated())
    weights = sum(p.numel() * 2 for p in _Wide().parameters())
    # The first cycle may keep other libraries' state; later cycles must add nothing.
    assert after[2] - after[0] < weights // 2, (after, weights)
