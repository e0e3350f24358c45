"""`trt-worker engines verify`: hashes every entry, stamps those that match (so workers need
not hash them at start), and fails on an entry whose bytes changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import engines.cache as cache_mod
from engines.cache import BuildRecipe, EngineCache, EngineFromCache
from engines.device import cpu_fingerprint
from worker.tools import engines_cli


def _entry(root: Path) -> cache_mod.CacheEntry:
    recipe = BuildRecipe("m", "ab" * 32, "onnxruntime", "1.0", cpu_fingerprint(), "fp32",
                         ({"name": "cpu", "kind": "range", "min": 1, "opt": 4, "max": 8},))

    def build(out: Path) -> None:
        out.write_bytes(b"plan")

    return EngineFromCache(EngineCache(root), recipe, build)()


def test_verify_stamps_good_entries_and_fails_on_an_edited_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "_RACY_NS", 0)  # the test's files are seconds old
    entry = _entry(tmp_path)
    ok = CliRunner().invoke(engines_cli.engines_app, ["verify", "--cache-dir", str(tmp_path)])
    assert ok.exit_code == 0 and "ok" in ok.output, ok.output
    assert (entry.path / ".verified.json").is_file()
    entry.artifact.write_bytes(b"PLAN")  # same size; the stamp must not vouch for it
    bad = CliRunner().invoke(engines_cli.engines_app, ["verify", "--cache-dir", str(tmp_path)])
    assert bad.exit_code == 1 and "does not match its sidecar" in " ".join(bad.output.split())
