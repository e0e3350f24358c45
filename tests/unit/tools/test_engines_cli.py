"""`trt-worker engines build`: a backend whose builds take minutes says so (its registry
record's ``build_hint``); on an AOTInductor engine it reports, per batch size, what the build
chose to serve and why (a tiny network on the CPU)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from engines.assembly import EngineParams, EnginePlan
from engines.backends.registry import BACKENDS
from engines.profiles import StaticProfile
from worker.tools import engines_cli


def _stand_in_plan(backend: str) -> Any:
    """A plan whose loader builds nothing: an empty cache that saves at once."""
    entry = SimpleNamespace(path=Path("entry"), sidecar={"artifact": {"bytes": 1_000_000}})
    cache = SimpleNamespace(lookup=lambda recipe: None,
                            lock=lambda recipe: contextlib.nullcontext(),
                            save=lambda recipe, build: entry)
    recipe = SimpleNamespace(device=SimpleNamespace(describe=lambda: "the CPU"))
    loader = SimpleNamespace(cache=cache, recipe=recipe, build=None)
    return SimpleNamespace(spec=SimpleNamespace(model_id="tiny"), backend=backend,
                           precision="fp32", profiles=(SimpleNamespace(name="p"),),
                           loader=lambda: loader)


@pytest.mark.parametrize("hint", ["compiles for a long while", None])
def test_the_build_hint_is_the_backend_record_s(monkeypatch: pytest.MonkeyPatch,
                                                hint: str | None) -> None:
    monkeypatch.setitem(BACKENDS, "slow", dataclasses.replace(
        BACKENDS["onnxruntime"], name="slow", build_hint=hint))
    monkeypatch.setattr(engines_cli, "engine_plans", lambda cfg: {"tiny": _stand_in_plan("slow")})
    monkeypatch.setattr(engines_cli, "console", engines_cli.Console(width=300))
    result = CliRunner().invoke(engines_cli.engines_app, ["build"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "building tiny (slow fp32, profiles p) for the CPU" in out
    assert ("compiles for a long while" in out) == (hint is not None)
    assert "built entry" in out


@pytest.mark.slow  # one Inductor compile
def test_build_reports_the_choice_per_batch_size(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")
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
