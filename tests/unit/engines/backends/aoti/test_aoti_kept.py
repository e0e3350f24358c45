"""One copy of a bundle's weights per process where the runtime never releases them."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engines.backends.aoti import kept as k
from engines.backends.aoti import weights as w
from engines.exceptions import EngineError

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


def _bundle(tmp_path: Path, tensors: dict[str, Any]) -> Path:
    path = tmp_path / "engine.aoti.zip"
    with zipfile.ZipFile(path, "w") as z:
        w.write_weights(z, tensors)
    return path


def test_where_the_runtime_keeps_bindings_one_copy_per_bundle_file_is_shared(
        tmp_path: Path, keeping: Callable[[bool], None]) -> None:
    keeping(True)
    path = _bundle(tmp_path, {"fc.weight": torch.randn(5, 7), "fc.bias": torch.randn(5)})
    first = k.shared_weights(path, "cpu")
    assert k.shared_weights(path, "cpu") is first  # a reactivation binds the same copy
    path.unlink()  # a rebuilt artifact under the same name is another file: read again
    path = _bundle(tmp_path, {"fc.weight": torch.ones(2, 2)})
    again = k.shared_weights(path, "cpu")
    assert again is not first and set(again) == {"fc.weight"}


def test_where_the_runtime_releases_bindings_every_load_reads_its_own_copy(
        tmp_path: Path, keeping: Callable[[bool], None]) -> None:
    keeping(False)
    path = _bundle(tmp_path, {"fc.weight": torch.randn(5, 7)})
    first = k.shared_weights(path, "cpu")
    assert k.shared_weights(path, "cpu") is not first and not k._kept


def test_the_runtime_header_tells_whether_bound_tensors_are_kept(tmp_path: Path) -> None:
    header = tmp_path / "utils.h"
    header.write_text("class RAIIAtenTensorHandle {\n};\nclass MaybeOwningAtenTensorHandle {\n")
    assert k.keeps_bindings(header)
    header.write_text("class RAIIAtenTensorHandle {\n};\n")  # after pytorch#194480
    assert not k.keeps_bindings(header)
    assert k.keeps_bindings(tmp_path / "missing.h")  # unknown: assume the old runtime


def test_the_installed_torch_has_the_runtime_header_the_check_reads() -> None:
    """The check reads this file; if torch moved it, every install would fall back to keeping
    weights (memory, not results), so a move must show here."""
    assert (Path(torch.__file__).parent / k.RUNTIME_HEADER).is_file()


def test_a_missing_bundle_fails_as_an_engine_error_when_weights_are_kept(
        tmp_path: Path, keeping: Callable[[bool], None]) -> None:
    keeping(True)
    with pytest.raises(EngineError, match=r"engine\.aoti\.zip"):
        k.shared_weights(tmp_path / "engine.aoti.zip", "cpu")
