"""Fixtures of the AOTInductor backend's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def keeping(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """``keeping(True)``: for this test, the runtime keeps weights bound by reference (torch
    before pytorch#194480); ``keeping(False)``: it releases them. The process's store of kept
    weights starts empty either way."""
    from engines.backends.aoti import kept as k

    def runtime(keeps: bool) -> None:
        monkeypatch.setattr(k, "_kept", {})
        monkeypatch.setattr(k, "runtime_keeps_bindings", lambda: keeps)

    return runtime
