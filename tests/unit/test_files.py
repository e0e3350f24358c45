"""worker.files.write_atomic: the file is replaced whole, no temp file is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.files import write_atomic


@pytest.mark.parametrize("sync_dir", [False, True])
def test_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path: Path, sync_dir: bool) -> None:
    target = tmp_path / "sub" / "state.json"
    write_atomic(target, b"first", sync_dir=sync_dir)
    write_atomic(target, b"second", sync_dir=sync_dir)
    assert target.read_bytes() == b"second"
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")
    with pytest.raises(TypeError):
        write_atomic(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
