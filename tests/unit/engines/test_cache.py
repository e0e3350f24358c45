"""Engine cache: keys, sidecar, atomic writes, one builder at a time, refusals."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from engines.cache import (
    ArtifactMismatch,
    BuildRecipe,
    CacheCorrupt,
    EngineCache,
    EngineFromCache,
    check_entry,
)
from engines.device import DeviceFingerprint, cpu_fingerprint

DEV = DeviceFingerprint("cuda", "NVIDIA H200", "9.0", "580.1", "13.0")


def recipe(**kw: object) -> BuildRecipe:
    base = BuildRecipe("m", "ab" * 32, "tensorrt", "10.8.0", DEV, "fp16",
                       ({"name": "gpu", "kind": "static", "batch_sizes": [1, 8]},))
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("change", [
    {"onnx_sha256": "cd" * 32}, {"backend": "torch"}, {"backend_version": "10.9.0"},
    {"device": replace(DEV, name="NVIDIA A100", arch="8.0")}, {"device": replace(DEV, driver="x")},
    {"device": replace(DEV, cuda="12.4")}, {"precision": "int8"}, {"flags": {"workspace_mb": 1}},
    {"profiles": ({"name": "gpu", "kind": "static", "batch_sizes": [1, 8, 32]},)},
])
def test_every_ingredient_changes_the_key(change: dict[str, object]) -> None:
    assert recipe(**change).key != recipe().key


def test_key_is_stable() -> None:
    assert recipe().key == recipe().key and len(recipe().key) == 20


def _write(payload: bytes) -> object:
    def build(out: Path) -> None:
        out.write_bytes(payload)
    return build


def test_build_then_load_without_rebuilding(tmp_path: Path) -> None:
    built: list[BuildRecipe] = []
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"),  # type: ignore[arg-type]
                             on_build=built.append)
    first = loader()
    second = loader()
    assert len(built) == 1 and first.path == second.path
    assert first.artifact.read_bytes() == b"plan"
    sc = json.loads((first.path / "sidecar.json").read_text())
    for field in ("onnx_sha256", "backend", "backend_version", "device", "precision", "profiles",
                  "flags", "built_at", "build_seconds", "artifact"):
        assert field in sc
    assert sc["artifact"]["bytes"] == 4 and sc["key"] == recipe().key


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def boom(out: Path) -> None:
        out.write_bytes(b"half")
        raise RuntimeError("builder crashed")

    cache = EngineCache(tmp_path)
    with pytest.raises(RuntimeError):
        EngineFromCache(cache, recipe(), boom)()
    assert cache.entries() == []
    assert not any(p.name.startswith(".") and p.is_dir() for p in (tmp_path / "m").iterdir())


def _slow_build(root: str, marker: str) -> None:
    def build(out: Path) -> None:
        with open(marker, "a") as f:
            f.write("built\n")
        time.sleep(0.5)
        out.write_bytes(b"plan")
    EngineFromCache(EngineCache(Path(root)), recipe(), build)()


def test_two_processes_build_once(tmp_path: Path) -> None:
    marker = tmp_path / "builds.txt"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_slow_build, args=(str(tmp_path / "c"), str(marker)))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert marker.read_text().count("built") == 1


def test_loading_for_another_device_is_refused_with_a_hint(tmp_path: Path) -> None:
    entry = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))()  # type: ignore[arg-type]
    a100 = replace(DEV, name="NVIDIA A100", arch="8.0")
    with pytest.raises(ArtifactMismatch, match=r"built for cuda: NVIDIA H200.*rebuild"):
        check_entry(entry, a100, None, verify_bytes=False)
    with pytest.raises(ArtifactMismatch, match=r"10\.8\.0, installed is 10\.9\.0"):
        check_entry(entry, DEV, "10.9.0", verify_bytes=False)


def test_tampered_artifact_fails_verification(tmp_path: Path) -> None:
    entry = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))()  # type: ignore[arg-type]
    check_entry(entry, DEV, "10.8.0", verify_bytes=True)
    entry.artifact.write_bytes(b"plan but edited")
    with pytest.raises(CacheCorrupt, match="does not match its sidecar"):
        check_entry(entry, DEV, "10.8.0", verify_bytes=True)


def test_cpu_fingerprint_names_the_isa() -> None:
    fp = cpu_fingerprint()
    assert fp.kind == "cpu" and ":" in fp.arch and fp.name


def test_an_edited_artifact_is_rebuilt_not_loaded(tmp_path: Path) -> None:
    built: list[BuildRecipe] = []
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"),  # type: ignore[arg-type]
                             on_build=built.append)
    loader().artifact.write_bytes(b"plan, edited after the build")
    entry = loader()
    assert len(built) == 2 and entry.artifact.read_bytes() == b"plan"


@pytest.mark.parametrize("name", ["../../../escape.bin", "/etc/hostname", "sub/engine.bin", ""])
def test_a_sidecar_naming_a_file_outside_its_entry_is_never_loaded(
        tmp_path: Path, name: str) -> None:
    built: list[BuildRecipe] = []
    cache = EngineCache(tmp_path / "cache")
    loader = EngineFromCache(cache, recipe(), _write(b"plan"), on_build=built.append)  # type: ignore[arg-type]
    first = loader()
    sidecar = first.path / "sidecar.json"
    doc = json.loads(sidecar.read_text())
    doc["artifact"]["name"] = name
    sidecar.write_text(json.dumps(doc))
    with pytest.raises(CacheCorrupt, match="not a file in the entry's folder"):
        _ = type(first)(first.path, doc).artifact
    entry = loader()  # the edited entry is dropped and built again
    assert len(built) == 2 and entry.artifact.parent == entry.path
    assert entry.artifact.read_bytes() == b"plan"


class _CountingHash:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import engines.cache as cache_mod

        self.calls = 0
        real = cache_mod._sha256_file

        def counted(path: Path) -> str:
            self.calls += 1
            return real(path)

        monkeypatch.setattr(cache_mod, "_sha256_file", counted)
        # Files in a test are seconds old at most: stamp them anyway.
        monkeypatch.setattr(cache_mod, "_RACY_NS", 0)


def test_a_stamped_artifact_is_not_hashed_again_at_lookup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))  # type: ignore[arg-type]
    entry = loader()  # built: hashed once for the sidecar
    hashes = _CountingHash(monkeypatch)
    assert loader().path == entry.path and hashes.calls == 1  # hashed, then stamped
    assert (entry.path / ".verified.json").is_file()
    for _ in range(3):
        assert loader().path == entry.path
    assert hashes.calls == 1
    check_entry(entry, DEV, "10.8.0", verify_bytes=True)  # `engines verify`: always hashes
    assert hashes.calls == 2


def test_a_stamp_holds_on_another_node_of_a_shared_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A ReadWriteMany volume: the same file, inode and times, under another device number on
    # each node. Each node used to hash the artifact again and overwrite the other's stamp.
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))  # type: ignore[arg-type]
    entry = loader()
    hashes = _CountingHash(monkeypatch)
    loader()  # this node: hashed and stamped
    real_stat = Path.stat

    class OtherMount:
        def __init__(self, st: os.stat_result) -> None:
            self._st = st

        def __getattr__(self, name: str) -> object:
            return getattr(self._st, name)

        @property
        def st_dev(self) -> int:
            return self._st.st_dev + 1

    def stat_elsewhere(self: Path, *args: object, **kw: object) -> object:
        st = real_stat(self, *args, **kw)  # type: ignore[arg-type]
        return OtherMount(st) if self == entry.artifact else st

    monkeypatch.setattr(Path, "stat", stat_elsewhere)
    assert Path(entry.artifact).stat().st_dev != real_stat(entry.artifact).st_dev
    for _ in range(2):
        assert loader().path == entry.path
    assert hashes.calls == 1


@pytest.mark.parametrize("edit", [b"plan, edited after the build", b"PLAN"])
def test_a_stamp_does_not_hide_an_edit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: bytes) -> None:
    built: list[BuildRecipe] = []
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"),  # type: ignore[arg-type]
                             on_build=built.append)
    hashes = _CountingHash(monkeypatch)
    entry = loader()
    loader()  # stamped
    time.sleep(0.05)  # past the file system's timestamp tick (the racy case is the guard's)
    entry.artifact.write_bytes(edit)  # b"PLAN": the same size, only the times and bytes differ
    again = loader()
    assert len(built) == 2 and again.artifact.read_bytes() == b"plan"
    assert hashes.calls >= 3


def test_an_unwritable_stamp_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))  # type: ignore[arg-type]
    entry = loader()
    (entry.path / ".verified.json").mkdir()  # os.replace onto a folder fails like a read-only cache
    hashes = _CountingHash(monkeypatch)
    assert loader().path == entry.path and loader().path == entry.path
    assert hashes.calls == 2  # no stamp: hashed at every lookup
    assert sorted(p.name for p in entry.path.iterdir()) == [".verified.json", "engine.bin",
                                                           "sidecar.json"]


def test_a_fresh_file_is_not_stamped(tmp_path: Path) -> None:
    entry = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))()  # type: ignore[arg-type]
    EngineCache(tmp_path).lookup(recipe())
    assert not (entry.path / ".verified.json").exists()  # changed within the last 2 s


def test_a_file_changed_while_it_is_hashed_is_not_stamped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engines.cache as cache_mod

    loader = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))  # type: ignore[arg-type]
    entry = loader()
    monkeypatch.setattr(cache_mod, "_RACY_NS", 0)
    real = cache_mod._sha256_file

    def hash_then_touch(path: Path) -> str:
        digest = real(path)
        time.sleep(0.05)
        path.write_bytes(b"plan")  # the same bytes, written again while the "hash" ran
        return digest

    monkeypatch.setattr(cache_mod, "_sha256_file", hash_then_touch)
    check_entry(entry, DEV, "10.8.0", verify_bytes=True, write_stamp=True)
    assert not (entry.path / ".verified.json").exists()


def test_engines_verify_stamps_what_hashes_right(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engines.cache as cache_mod

    entry = EngineFromCache(EngineCache(tmp_path), recipe(), _write(b"plan"))()  # type: ignore[arg-type]
    monkeypatch.setattr(cache_mod, "_RACY_NS", 0)
    check_entry(entry, DEV, "10.8.0", verify_bytes=True)  # a plain check writes nothing
    assert not (entry.path / ".verified.json").exists()
    check_entry(entry, DEV, "10.8.0", verify_bytes=True, write_stamp=True)
    stamp = json.loads((entry.path / ".verified.json").read_text())
    assert stamp["sha256"] == entry.sidecar["artifact"]["sha256"]
