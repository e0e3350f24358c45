"""The tiny classifier's engine: a random-weight ONNX graph built with onnx.helper, planned for
onnxruntime (the CPU backend) like any model's engine, so the cache builds and keys it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.assembly import EnginePlan, bucket_profiles
from engines.loaders import OnnxModel
from engines.spec import EngineSpec, TensorSpec
from tests.unit.tasks.moderation.tiny_model.settings import settings_of
from worker.config import WorkerConfig
from worker.tasks.moderation.engine_params import engine_params

LABELS = ("bright", "dark")
INPUT, OUTPUT = "pixels", "probs"


def tiny_onnx(seed: int) -> bytes:
    """[N, 3, S, S] -> per-channel mean -> a random 3x2 linear layer -> softmax [N, 2]."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.normal(0, 2, (3, 2)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.5, (2,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", [INPUT], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("Gemm", ["flat", "w", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], [OUTPUT], axis=1)],
        "tiny", [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["n", 3, "s", "s"])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["n", 2])],
        initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what the installed onnxruntime reads
    onnx.checker.check_model(model)
    return model.SerializeToString()


@dataclass(frozen=True)
class TinyOnnx:
    seed: int

    def __call__(self) -> OnnxModel:
        data = tiny_onnx(self.seed)
        return OnnxModel(data, hashlib.sha256(data).hexdigest(), f"tiny-s{self.seed}")


def engine_plan(cfg: WorkerConfig) -> EnginePlan:
    s = settings_of(cfg)
    spec = EngineSpec(model_id=f"tiny-s{s.seed}", onnx=TinyOnnx(s.seed),
                      inputs=(TensorSpec(INPUT, (-1, 3, s.size, s.size)),),
                      outputs=(TensorSpec(OUTPUT, (-1, len(LABELS))),), labels=LABELS)
    profiles = bucket_profiles("tiny", [(3, s.size, s.size)], s.batch_sizes, "onnxruntime")
    return EnginePlan(spec, profiles, engine_params(cfg, "onnxruntime", "fp32"))


def engine_plans(cfg: WorkerConfig) -> dict[str, EnginePlan]:
    """The package's ``engines build`` entry: its one engine."""
    return {"tiny": engine_plan(cfg)}
