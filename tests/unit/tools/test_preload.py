"""Preloading torch: only where the configured engine runs on torch, and never fatal."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from worker.config import load_config
from worker.tools.preload import _import, needs_torch, preload_torch


@pytest.mark.parametrize(("overrides", "expected"), [
    ({}, False),  # the embedded default: ONNX Runtime
    ({"model": {"backend": "torch"}}, True),
    ({"model": {"backend": "aoti"}}, True),
    ({"processing": {"task": "generation"}}, True),  # SD on cuda:0
    ({"processing": {"task": "generation"},
      "generation": {"device": "cpu", "precision": "fp32"}}, False),
    ({"processing": {"task": "generation"}, "generation": {"backend": "onnxruntime",
                                                           "precision": "fp32"}}, False),
])
def test_torch_is_preloaded_only_for_torch_engines(overrides: dict[str, Any],
                                                   expected: bool) -> None:
    assert needs_torch(load_config(**overrides)) is expected


def test_the_preload_imports_torch_in_a_thread() -> None:
    thread = preload_torch(load_config(model={"backend": "torch"}))
    assert thread is not None and thread.daemon and thread.name == "preload-torch"
    thread.join(120)
    assert not thread.is_alive() and "torch" in sys.modules
    assert preload_torch(load_config()) is None


def test_a_failing_import_is_left_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(name: str) -> None:
        raise ImportError(f"{name}: libcudart.so.13 not found")

    monkeypatch.setattr("worker.tools.preload.importlib.import_module", boom)
    _import("torch")  # no exception: the engine's own import reports it
