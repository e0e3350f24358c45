"""worker.config.model: which precision each backend accepts (onnxruntime int8 is opt-in)."""

from __future__ import annotations

import pytest

from engines.backends.registry import BACKENDS
from worker.config import load_config
from worker.exceptions import ConfigError


def test_onnxruntime_defaults_to_fp32_and_accepts_int8() -> None:
    assert load_config().model.effective_precision == "fp32"
    cfg = load_config(model={"backend": "onnxruntime", "precision": "int8"})
    assert (cfg.model.backend, cfg.model.effective_precision) == ("onnxruntime", "int8")


@pytest.mark.parametrize("backend,precision", [
    ("onnxruntime", "fp16"), ("onnxruntime", "fp8"), ("torch", "int8"), ("aoti", "int8"),
    ("torch", "fp8"), ("aoti", "fp8"),
])
def test_combinations_that_do_not_exist_are_refused(backend: str, precision: str) -> None:
    with pytest.raises(ConfigError, match=f"backend {backend} does not support precision "
                                          f"{precision}"):
        load_config(model={"backend": backend, "precision": precision})


def test_every_listed_combination_is_accepted() -> None:
    for backend, record in BACKENDS.items():
        for precision in record.precisions:
            assert load_config(model={"backend": backend, "precision": precision}
                               ).model.effective_precision == precision


@pytest.mark.parametrize("decoder", ["nvimgcodec", "dali"])
def test_the_other_gpu_decoders_need_gpu_preprocessing(decoder: str) -> None:
    with pytest.raises(ConfigError, match=f"gpu_jpeg_decoder = {decoder} needs preprocess = gpu"):
        load_config(model={"gpu_jpeg_decoder": decoder})
    cfg = load_config(model={"backend": "torch", "preprocess": "gpu", "jpeg_roundtrip": False,
                             "gpu_jpeg_decoder": decoder})
    assert cfg.model.gpu_jpeg_decoder == decoder
    assert load_config().model.gpu_jpeg_decoder == "torchvision"
