"""The CUDA context made during torch's import: the driver calls in order, once per device,
never when torch is already imported, and a failing driver leaves it to torch."""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import pytest

from engines import context_early


class FakeDriver(types.ModuleType):
    def __init__(self, fail: str | None = None) -> None:
        super().__init__("cuda.bindings.driver")
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def _answer(self, name: str, arg: Any, value: Any) -> tuple[Any, ...]:
        self.calls.append((name, arg))
        err = 999 if name == self.fail else 0
        return (err,) if value is None else (err, value)

    def cuInit(self, flags: int) -> tuple[Any, ...]:
        return self._answer("cuInit", flags, None)

    def cuDeviceGet(self, index: int) -> tuple[Any, ...]:
        return self._answer("cuDeviceGet", index, f"dev{index}")

    def cuDevicePrimaryCtxRetain(self, device: str) -> tuple[Any, ...]:
        return self._answer("cuDevicePrimaryCtxRetain", device, "ctx")


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    fake = FakeDriver()
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(context_early, "_started", {})
    return fake


def test_retains_the_primary_context_of_the_device_once(driver: FakeDriver) -> None:
    thread = context_early.begin_context(1)
    assert thread is not None
    thread.join(5)
    assert driver.calls == [("cuInit", 0), ("cuDeviceGet", 1),
                            ("cuDevicePrimaryCtxRetain", "dev1")]
    assert context_early.begin_context(1) is None  # once per device and process
    assert len(driver.calls) == 3


def test_nothing_once_torch_is_imported(driver: FakeDriver,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    assert context_early.begin_context(0) is None
    assert driver.calls == []


@pytest.mark.parametrize("failing", ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"])
def test_a_failing_call_stops_there_and_says_so(driver: FakeDriver, failing: str,
                                                caplog: pytest.LogCaptureFixture) -> None:
    driver.fail = failing
    with caplog.at_level(logging.INFO, logger="engines"):
        thread = context_early.begin_context(0)
        assert thread is not None
        thread.join(5)
    assert [name for name, _ in driver.calls][-1] == failing
    assert any("torch makes the context" in r.getMessage() for r in caplog.records)


def test_turned_off_by_its_variable(driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_CUDA_CONTEXT_EARLY", "0")
    assert context_early.begin_context(0) is None
    assert driver.calls == []
