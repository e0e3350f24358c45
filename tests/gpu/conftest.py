"""GPU tests: marked `gpu`, skipped with the reason where torch or CUDA is missing."""

from __future__ import annotations

import importlib.util

import pytest


def _why_not() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install 'kafka-trt-worker[gpu]')"
    import torch

    return None if torch.cuda.is_available() else "no CUDA device on this machine"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _why_not()
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
