"""torch.compile's cache artifacts are generated code: loaded only when their digest matches."""

from __future__ import annotations

from pathlib import Path

import pytest

runner = pytest.importorskip("engines.backends.torch.runner",
                             reason="the torch backend needs torch (extra `gpu`)")


def test_written_artifacts_load_and_edited_ones_do_not(tmp_path: Path) -> None:
    path = tmp_path / "inductor-abc.bin"
    assert runner.read_verified(path) is None  # nothing there: compile from scratch
    runner.write_verified(path, b"generated code")
    assert runner.read_verified(path) == b"generated code"
    path.write_bytes(b"generated code, edited")
    assert runner.read_verified(path) is None
    runner.write_verified(tmp_path / "inductor-def.bin", b"x")
    (tmp_path / "inductor-def.bin.sha256").unlink()
    assert runner.read_verified(tmp_path / "inductor-def.bin") is None  # no digest: not loaded
    assert runner.read_verified(None) is None
