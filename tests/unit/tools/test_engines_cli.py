"""`trt-worker engines build` on an AOTInductor engine: it says a compile takes minutes and
reports, per batch size, what the build chose to serve and why (a tiny network on the CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from engines.assembly import EngineParams, EnginePlan
from engines.profiles import StaticProfile
from worker.tools import engines_cli

pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


@pytest.mark.slow  # one Inductor compile
def test_build_reports_the_choice_per_batch_size(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.engines.backends.aoti.test_aoti_cpu import ITEM, _spec

    plan = EnginePlan(_spec(), (StaticProfile("p", ITEM, (2,)),),
                      EngineParams(backend="aoti", precision="fp32", device="cpu",
                                   cache_dir=tmp_path))
    monkeypatch.setattr(engines_cli, "engine_plans", lambda cfg: {"tiny": plan})
    monkeypatch.setattr(engines_cli, "console", engines_cli.Console(width=300))
    result = CliRunner().invoke(engines_cli.engines_app, ["build"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "AOTInductor compiles each batch size" in out
    line: Any = next(x for x in result.output.splitlines() if "b2_8x8x3: serving" in x)
    assert "aoti" in line and " ms" in line and "compiled in" in line and "max error" in line
    again = CliRunner().invoke(engines_cli.engines_app, ["build"])
    assert again.exit_code == 0 and "cached:" in again.output
