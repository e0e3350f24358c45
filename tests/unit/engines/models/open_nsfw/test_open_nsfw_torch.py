"""The native torch open_nsfw equals the ONNX graph (float32, on the CPU)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from engines.models.open_nsfw import bundled_onnx_path, open_nsfw_spec
from tests.harness.conformance_inputs import conformance_batch

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


def test_native_module_matches_onnx_exactly_in_float32() -> None:
    from engines.models.open_nsfw.net import build_module

    x = conformance_batch(n_synthetic=16)
    ref = ort.InferenceSession(str(bundled_onnx_path()),
                               providers=["CPUExecutionProvider"]).run(["outputs"],
                                                                       {"input:0": x})[0]
    net = build_module(open_nsfw_spec().onnx().data)
    with torch.no_grad():
        got = net(torch.from_numpy(x)).numpy()
    # Same maths, different float32 summation order (oneDNN vs MLAS): ~3e-6 seen.
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def test_weights_come_from_the_onnx_initializers() -> None:
    from engines.models.open_nsfw.net import OpenNsfwNet, state_dict_from_onnx

    sd = state_dict_from_onnx(open_nsfw_spec().onnx().data)
    assert set(sd) == set(OpenNsfwNet().state_dict())
    assert all(float(v.abs().sum()) > 0 for v in sd.values()), "no parameter may be all zeros"
