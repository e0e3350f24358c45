"""The bundle's weights: stored once with their layout, read back as views of one buffer."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from engines.backends.aoti import weights as w
from engines.exceptions import EngineError

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")


def _tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    conv = torch.randn(8, 3, 3, 3, generator=g).to(memory_format=torch.channels_last)
    return {
        "conv.weight": conv.half(),  # channels-last, fp16
        "fc.weight": torch.randn(5, 7, generator=g),
        "fc.bias": torch.randn(5, generator=g).to(torch.bfloat16),
        "scale": torch.tensor(2.5),  # 0-dim
        "mask": torch.tensor([True, False, True]),
        "steps": torch.arange(3, dtype=torch.int64),
        "view": torch.randn(4, 6, generator=g)[1:3],  # a dense view with a storage offset
    }


def _bundle(tmp_path: Path, tensors: dict[str, Any], *, compression: int = zipfile.ZIP_STORED
            ) -> Path:
    path = tmp_path / "engine.aoti.zip"
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("b1_8.pt2", b"package bytes before the weights")
        w.write_weights(z, tensors)
    return path


def test_weights_come_back_equal_with_their_layout_and_aligned(tmp_path: Path) -> None:
    tensors = _tensors()
    got = w.read_weights(_bundle(tmp_path, tensors), "cpu")
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert got[name].stride() == t.stride(), name
        assert torch.equal(got[name], t), name
    assert got["conv.weight"].is_contiguous(memory_format=torch.channels_last)
    # views of one buffer (nothing copied per tensor), each at an aligned offset in it; the
    # buffer's own start is the allocator's (CPU: 64 bytes; CUDA's caching allocator: 512)
    (base,) = {got[n].untyped_storage().data_ptr() for n in got}
    assert base % 64 == 0
    assert all((got[n].data_ptr() - base) % w.ALIGN == 0 for n in got)


def test_strided_weights_that_are_not_dense_are_refused(tmp_path: Path) -> None:
    sparse_rows = torch.randn(6, 4)[::2]  # every other row: a gap the blob cannot keep
    with pytest.raises(EngineError, match="'rows' is not dense"):
        _bundle(tmp_path, {"rows": sparse_rows})


def test_a_bundle_without_weights_and_damaged_weights_fail_clearly(tmp_path: Path) -> None:
    old = tmp_path / "old.zip"
    with zipfile.ZipFile(old, "w") as z:  # packages that held their own weights
        z.writestr("b1_8.pt2", b"x")
    with pytest.raises(EngineError, match=r"old.zip: no weights: .* rebuild the engine"):
        w.read_weights(old, "cpu")
    path = _bundle(tmp_path, _tensors())
    with zipfile.ZipFile(path) as z:
        index = json.loads(z.read(w.INDEX))
    truncated = tmp_path / "truncated.zip"
    with zipfile.ZipFile(truncated, "w") as z:
        z.writestr(w.INDEX, json.dumps(index))
        z.writestr(w.BLOB, b"\0" * 16)
    with pytest.raises(EngineError, match=r"truncated.zip: weight .* lies outside the blob"):
        w.read_weights(truncated, "cpu")
    for broken in ({"tensors": {"x": {"dtype": "no_such_dtype", "shape": [1], "stride": [1],
                                      "offset": 0, "nbytes": 4}}}, {"no": "tensors"}):
        with zipfile.ZipFile(truncated, "w") as z:
            z.writestr(w.INDEX, json.dumps(broken))
            z.writestr(w.BLOB, b"\0" * 16)
        with pytest.raises(EngineError, match="the weights do not read"):
            w.read_weights(truncated, "cpu")
    with zipfile.ZipFile(truncated, "w") as z:
        z.writestr(w.INDEX, json.dumps(index))  # no blob
    with pytest.raises(EngineError, match="the weights do not read"):
        w.read_weights(truncated, "cpu")
    deflated = _bundle(tmp_path, _tensors(), compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(EngineError, match="compressed"):
        w.read_weights(deflated, "cpu")


class _Package:
    """What ``bind`` uses of an AOTInductor package."""

    def __init__(self, fqns: list[str]) -> None:
        self.fqns, self.loaded = fqns, None

    def get_constant_fqns(self) -> list[str]:
        return self.fqns

    def load_constants(self, constants: dict[str, Any], *, check_full_update: bool,
                       user_managed: bool) -> None:
        assert check_full_update and user_managed
        self.loaded = constants


def test_bind_passes_exactly_the_named_constants_by_reference_and_names_a_missing_one() -> None:
    tensors = _tensors()
    package = _Package(["fc.weight", "scale"])
    w.bind(package, tensors, "b1")
    assert package.loaded is not None and set(package.loaded) == {"fc.weight", "scale"}
    assert package.loaded["fc.weight"] is tensors["fc.weight"]
    with pytest.raises(EngineError, match=r"b1: the package needs 1 constants .*'absent'.* "
                                          r"register it as a buffer"):
        w.bind(_Package(["fc.weight", "absent"]), tensors, "b1")

