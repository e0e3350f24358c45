"""The engine cache: a lazy loader that loads an artifact or builds and saves it.

Key = SHA-256 over (ONNX bytes' hash, backend and its version, device fingerprint, precision,
profiles, flags). Each entry is a folder ``<root>/<model_id>/<key>/`` holding the artifact and
``sidecar.json`` recording all of that plus the artifact's own hash, size and build time.
Writes are atomic (built in a temp folder, renamed into place) and an exclusive file lock keeps
a second builder (another worker starting at the same time) waiting instead of building twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engines.device import DeviceFingerprint
from engines.exceptions import EngineError

log = logging.getLogger("engines")

SIDECAR = "sidecar.json"
STAMP = ".verified.json"  # the artifact's file identity when it last hashed right (see below)
FORMAT_VERSION = 1
# A stamp is not written for a file changed this recently: an edit within the same timestamp
# tick as the one hashed would otherwise keep the stamp's identity (git's "racy" index entries).
_RACY_NS = 2_000_000_000


# What a builder may report about its artifact (e.g. per-profile timings and the variant it
# chose to serve); JSON-serialisable, recorded in the sidecar under "build".
BuildNotes = dict[str, Any]


class ArtifactMismatch(EngineError):
    """An artifact was built for another device, backend version or model."""


class CacheCorrupt(EngineError):
    """An entry's artifact does not match its sidecar (truncated, edited)."""


@dataclass(frozen=True, slots=True)
class BuildRecipe:
    """Everything that determines an artifact's bytes; its digest is the cache key."""

    model_id: str
    onnx_sha256: str
    backend: str
    backend_version: str
    device: DeviceFingerprint
    precision: str
    profiles: tuple[dict[str, Any], ...]
    flags: dict[str, Any] = field(default_factory=dict)
    artifact_name: str = "engine.bin"

    def identity(self) -> dict[str, Any]:
        return {
            "format": FORMAT_VERSION, "model_id": self.model_id, "onnx_sha256": self.onnx_sha256,
            "backend": self.backend, "backend_version": self.backend_version,
            "device": self.device.to_dict(), "precision": self.precision,
            "profiles": list(self.profiles), "flags": self.flags,
        }

    @property
    def key(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True, slots=True)
class CacheEntry:
    path: Path  # the entry's folder
    sidecar: dict[str, Any]

    @property
    def artifact(self) -> Path:
        """The artifact's path, confined to the entry's folder: the sidecar names a plain file
        (an absolute path or ``..`` in an edited sidecar would load something else)."""
        name = str(self.sidecar["artifact"]["name"])
        if not name or Path(name).name != name or name in (".", ".."):
            raise CacheCorrupt(f"engine {self.key}: its sidecar names the artifact {name!r}, "
                               "not a file in the entry's folder")
        return self.path / name

    @property
    def key(self) -> str:
        return str(self.sidecar["key"])


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file (hex); ~1 GB/s, so a start-up check of the largest engine (the
    SD UNet, ~1.7 GB in fp16) costs about a second."""
    return _sha256_file(path)


def default_cache_dir() -> Path:
    base = os.environ.get("KTW_CACHE_DIR") or Path.home() / ".cache" / "kafka-trt-worker"
    return Path(base) / "engines"


class EngineCache:
    """``verify``: check an entry's artifact against the SHA-256 in its sidecar whenever it is
    looked up (a corrupt entry is removed and rebuilt, never loaded). A full hash costs seconds
    for the SD engines at every start, so a lookup trusts the entry's stamp (the artifact's size,
    times and inode when it last hashed right) and hashes only when the file changed;
    ``trt-worker engines verify`` always hashes."""

    def __init__(self, root: Path | None = None, *, verify: bool = True) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()
        self.verify = verify

    def entry_dir(self, recipe: BuildRecipe) -> Path:
        return self.root / recipe.model_id / recipe.key

    def lookup(self, recipe: BuildRecipe) -> CacheEntry | None:
        folder = self.entry_dir(recipe)
        sidecar = folder / SIDECAR
        if not sidecar.is_file():
            return None
        entry = CacheEntry(folder, json.loads(sidecar.read_text()))
        try:
            check_entry(entry, recipe.device, recipe.backend_version,
                        verify_bytes=self.verify, trust_stamp=True, write_stamp=True)
        except CacheCorrupt as exc:
            # Truncated, edited or escaping: never load it; the loader builds it again.
            log.error("engine_cache_entry_corrupt: %s; removed, it is built again", exc)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return entry

    @contextmanager
    def lock(self, recipe: BuildRecipe) -> Iterator[None]:
        locks = self.root / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{recipe.key}.lock").open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def save(self, recipe: BuildRecipe, build: Callable[[Path], BuildNotes | None]
             ) -> CacheEntry:
        """Run ``build(artifact_path)`` in a temp folder, write the sidecar, rename into place.

        What the builder returns (measurements, choices it made) is recorded under ``build``."""
        final = self.entry_dir(recipe)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{recipe.key}-", dir=final.parent))
        try:
            started = time.monotonic()
            notes = build(tmp / recipe.artifact_name)
            seconds = time.monotonic() - started
            artifact = tmp / recipe.artifact_name
            if not artifact.is_file():
                raise EngineError(f"builder for {recipe.backend} wrote no artifact")
            sidecar = {
                **recipe.identity(),
                "key": recipe.key,
                "artifact": {"name": recipe.artifact_name, "sha256": _sha256_file(artifact),
                             "bytes": artifact.stat().st_size},
                "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "build_seconds": round(seconds, 3),
                "built_on": socket.gethostname(),
                **({"build": notes} if notes else {}),
            }
            (tmp / SIDECAR).write_text(json.dumps(sidecar, indent=2, sort_keys=True))
            for f in tmp.iterdir():
                with f.open("rb") as fh:
                    os.fsync(fh.fileno())
            if final.exists():  # a stale or corrupt entry we are replacing
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CacheEntry(final, sidecar)

    def entries(self) -> list[CacheEntry]:
        out = []
        for sidecar in sorted(self.root.glob(f"*/*/{SIDECAR}")):
            try:
                out.append(CacheEntry(sidecar.parent, json.loads(sidecar.read_text())))
            except json.JSONDecodeError:
                continue  # reported by verify as corrupt; never fatal for listing
        return out

    def remove(self, entry: CacheEntry) -> None:
        shutil.rmtree(entry.path)


def check_entry(entry: CacheEntry, device: DeviceFingerprint, backend_version: str | None,
                *, verify_bytes: bool, trust_stamp: bool = False, write_stamp: bool = False
                ) -> None:
    """Refuse an entry built for another device or backend version, or whose bytes changed.

    ``trust_stamp``: skip the hash when the artifact's file identity equals the entry's stamp.
    ``write_stamp``: stamp the entry after a hash that matched (best effort: a read-only cache
    hashes every time). A truncation, an edit or a copy over the file changes its size or
    ctime; what a stamp cannot see is a bit flipped on disk under an unchanged inode, which
    `engines verify` (always hashing) does."""
    sc = entry.sidecar
    built_for = DeviceFingerprint.from_dict(sc["device"])
    hint = ("rebuild it on this machine: `trt-worker engines build`, or delete the entry "
            f"({entry.path})")
    if built_for != device:
        raise ArtifactMismatch(
            f"engine {entry.key} was built for {built_for.describe()}, this machine is "
            f"{device.describe()}; {hint}"
        )
    if backend_version is not None and sc["backend_version"] != backend_version:
        raise ArtifactMismatch(
            f"engine {entry.key} was built with {sc['backend']} {sc['backend_version']}, "
            f"installed is {backend_version}; {hint}"
        )
    if verify_bytes:
        if not entry.artifact.is_file():
            raise CacheCorrupt(f"engine {entry.key}: artifact {entry.artifact} is missing")
        expected = sc["artifact"]["sha256"]
        if trust_stamp and _stamped(entry, expected):
            return
        before, started = _file_identity(entry.artifact), time.time_ns()
        digest = _sha256_file(entry.artifact)
        if digest != expected:
            raise CacheCorrupt(f"engine {entry.key}: artifact hash {digest[:12]} does not match "
                               f"its sidecar ({expected[:12]}); {hint}")
        if write_stamp:
            _stamp(entry, digest, before, started)


def _file_identity(path: Path) -> list[int]:
    """Size, modification and change times, inode. Not the device number: pods on other nodes
    mounting one shared (ReadWriteMany) cache see other device numbers for the same file, and
    each would hash the artifact again and overwrite the others' stamp at every start."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _stamped(entry: CacheEntry, sha256: str) -> bool:
    try:
        stamp = json.loads((entry.path / STAMP).read_text())
        return bool(stamp == {"sha256": sha256, "file": _file_identity(entry.artifact)})
    except (OSError, ValueError):
        return False


def _stamp(entry: CacheEntry, sha256: str, identity: list[int], hashed_at_ns: int) -> None:
    """Record that the artifact, as it was when its hash began (``identity``), hashed right.
    Written atomically; skipped when the file changed while it was hashed, when it had changed
    less than two seconds before, and where the cache is read-only."""
    if _file_identity(entry.artifact) != identity:
        return
    if hashed_at_ns - max(identity[1], identity[2]) < _RACY_NS:
        return
    tmp = entry.path / f"{STAMP}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps({"sha256": sha256, "file": identity}))
        os.replace(tmp, entry.path / STAMP)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.debug("engine_cache_stamp_not_written: %s", exc)


@dataclass(frozen=True, slots=True)
class EngineFromCache:
    """Lazy loader: the cached artifact for ``recipe``, built with ``build`` when missing."""

    cache: EngineCache
    recipe: BuildRecipe
    build: Callable[[Path], BuildNotes | None]
    on_build: Callable[[BuildRecipe], None] | None = None  # e.g. start a progress display

    def __call__(self) -> CacheEntry:
        entry = self.cache.lookup(self.recipe)
        if entry is not None:
            return entry
        with self.cache.lock(self.recipe):
            entry = self.cache.lookup(self.recipe)  # another builder may have finished
            if entry is not None:
                return entry
            if self.on_build is not None:
                self.on_build(self.recipe)
            return self.cache.save(self.recipe, self.build)
