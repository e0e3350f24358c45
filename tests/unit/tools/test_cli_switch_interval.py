"""`trt-worker run` sets the process's GIL switch interval from processing.switch_interval_ms
before it builds anything, and leaves Python's alone without it."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


class _Built(Exception):
    """Raised by the stand-in build: the run stops there."""


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    from worker.loop import build

    intervals: list[float] = []

    def fake_build(cfg: object) -> None:
        intervals.append(sys.getswitchinterval())
        raise _Built

    monkeypatch.setattr(build, "build_worker", fake_build)
    was = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield intervals
    finally:
        sys.setswitchinterval(was)


@pytest.mark.parametrize(("env", "expected"), [("0.5", 0.0005), (None, 0.005)])
def test_run_sets_the_switch_interval_it_is_given(
        seen: list[float], monkeypatch: pytest.MonkeyPatch, env: str | None,
        expected: float) -> None:
    from typer.testing import CliRunner

    from worker.tools.cli import app

    if env is not None:
        monkeypatch.setenv("KTW_PROCESSING__SWITCH_INTERVAL_MS", env)
    result = CliRunner().invoke(app, ["run", "-b", "127.0.0.1:9"])
    assert isinstance(result.exception, _Built), result.output
    assert seen == [pytest.approx(expected)]


def test_a_switch_interval_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.config import load_config
    from worker.exceptions import ConfigError

    monkeypatch.setenv("KTW_PROCESSING__SWITCH_INTERVAL_MS", "0")
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        load_config()
