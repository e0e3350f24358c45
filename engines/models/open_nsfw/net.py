"""open_nsfw as a native torch module, weights loaded from the ONNX initializers.

Why not a generic ONNX-to-torch conversion: it keeps the graph's NHWC transposes and its Reshape
reads the shape tensor on the host, which breaks CUDA-graph capture. This re-implementation is
exact (same ops, same padding, including TensorFlow's asymmetric max-pool padding) and runs NCHW
convolutions in channels-last memory, which is what the input's NHWC layout already is.
Imports torch (and onnx, to read the weights); only the torch backend's path loads it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engines.exceptions import EngineError

# (blocks, bottleneck width, output width, stride of the first block) per stage: ResNet-50-thin.
STAGES = ((3, 32, 128, 1), (4, 64, 256, 2), (6, 128, 512, 2), (3, 256, 1024, 2))
_CONV = re.compile(r"^bn_stage(\d)_block(\d)_(branch2a|branch2b|branch2c|proj_shortcut)/")
_BRANCH = {"branch2a": "a", "branch2b": "b", "branch2c": "c", "proj_shortcut": "proj"}


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, stride: int) -> None:
        super().__init__()
        # Caffe-style ResNet: the stride sits on the first 1x1 convolution.
        self.a = nn.Conv2d(cin, mid, 1, stride)
        self.b = nn.Conv2d(mid, mid, 3, 1, padding=1)
        self.c = nn.Conv2d(mid, cout, 1)
        self.proj = nn.Conv2d(cin, cout, 1, stride) if (cin != cout or stride != 1) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.a(x))
        y = F.relu(self.b(y))
        y = self.c(y)
        return F.relu(y + (self.proj(x) if self.proj is not None else x))


class OpenNsfwNet(nn.Module):
    """Input: NHWC float [N, 224, 224, 3] (BGR, mean-subtracted). Output: [N, 2] (sfw, nsfw)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, padding=3)
        stages, cin = [], 64
        for blocks, mid, cout, stride in STAGES:
            layers = [Bottleneck(cin if i == 0 else cout, mid, cout, stride if i == 0 else 1)
                      for i in range(blocks)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(1024, 2)

    def forward(self, x_nhwc: torch.Tensor) -> torch.Tensor:
        # A permuted NHWC tensor *is* an NCHW tensor in channels-last memory: no copy.
        x = x_nhwc.permute(0, 3, 1, 2).to(self.conv1.weight.dtype)
        x = F.relu(self.conv1(x))
        # TensorFlow SAME padding of the 3x3/2 max-pool: one extra row/column bottom-right.
        x = F.max_pool2d(F.pad(x, (0, 1, 0, 1), value=float("-inf")), 3, 2)
        x = self.stages(x)
        x = F.avg_pool2d(x, 7).flatten(1)
        return torch.softmax(self.fc(x).float(), dim=1)


def state_dict_from_onnx(onnx_bytes: bytes) -> dict[str, torch.Tensor]:
    """Map the ONNX graph's Conv/MatMul initializers onto :class:`OpenNsfwNet`'s parameters."""
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as exc:
        raise EngineError("the torch backend reads ONNX weights with the `onnx` package; "
                          "pip install 'kafka-trt-worker[gpu]'") from exc
    graph = onnx.load_from_string(onnx_bytes).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    out: dict[str, Any] = {}
    for node in graph.node:
        if node.op_type == "Conv":
            name = _param_name(node.output[0])
            out[f"{name}.weight"], out[f"{name}.bias"] = inits[node.input[1]], inits[node.input[2]]
        elif node.op_type == "MatMul":
            out["fc.weight"] = np.ascontiguousarray(inits[node.input[1]].T)
        elif node.op_type == "Add" and node.input[1] in inits:
            out["fc.bias"] = inits[node.input[1]]
    expected = set(OpenNsfwNet().state_dict())
    if set(out) != expected:
        missing, extra = sorted(expected - set(out)), sorted(set(out) - expected)
        raise EngineError(f"ONNX graph does not match open_nsfw: missing {missing[:5]}, "
                          f"unexpected {extra[:5]}")
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, copy=True)) for k, v in out.items()}


def _param_name(conv_output: str) -> str:
    if conv_output.startswith("bn_1/"):
        return "conv1"
    m = _CONV.match(conv_output)
    if m is None:
        raise EngineError(f"unexpected convolution {conv_output!r} in the open_nsfw graph")
    stage, block, branch = m.groups()
    return f"stages.{stage}.{block}.{_BRANCH[branch]}"


def build_module(onnx_bytes: bytes) -> OpenNsfwNet:
    net = OpenNsfwNet()
    net.load_state_dict(state_dict_from_onnx(onnx_bytes))
    return net.eval()
