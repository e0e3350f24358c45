"""Resolve the broker's runtime jars from Maven Central into a local cache.

The Apache download site is unreachable in our CI, so instead of the release
tarball we let Maven copy `kafka_2.13` plus its runtime closure (see pom.xml).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import LocalKafkaError, tail

# 4.1.1: a mature 4.x patch release (checked: 4.0.0, 4.2.0 and 4.4.0 also run
# on Java 17 with this pom); every 4.x broker needs Java >= 17.
DEFAULT_VERSION = "4.1.1"
MARKER = ".ktw-complete.json"
POM = Path(__file__).with_name("pom.xml")
MVN_TIMEOUT_S = 900.0


def jar_cache_root() -> Path:
    env = os.environ.get("KTW_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "kafka-trt-worker"


def _pom_digest() -> str:
    # Stored in the marker so editing pom.xml (e.g. adding a jar) refreshes caches.
    return hashlib.sha256(POM.read_bytes()).hexdigest()[:16]


def _is_complete(libs: Path, version: str) -> bool:
    """True if `libs` holds a finished download (marker + every listed jar)."""
    try:
        info = json.loads((libs / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict) or info.get("version") != version:
        return False
    if info.get("pom") != _pom_digest():
        return False
    jars = info.get("jars")
    if not isinstance(jars, list) or not jars:
        return False
    return all((libs / str(name)).is_file() for name in jars)


def _mvn_command(version: str, out_dir: Path) -> list[str]:
    mvn = os.environ.get("KTW_MVN") or shutil.which("mvn")
    if not mvn:
        raise LocalKafkaError("Maven ('mvn') not found on PATH; it is needed to fetch Kafka jars")
    cmd = [mvn, "-B", "-q", "-Dstyle.color=never"]
    # Maven 3.8 ignores MAVEN_ARGS (3.9+ reads it itself); we pass it explicitly
    # and drop it from the child env so 3.9+ does not apply it twice.
    cmd += shlex.split(os.environ.get("MAVEN_ARGS", ""))
    settings = os.environ.get("KTW_MAVEN_SETTINGS")
    if settings:
        cmd += ["-s", settings]
    cmd += [
        "-f", str(POM),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={out_dir}",
    ]
    return cmd


def _download(version: str, dest: Path) -> None:
    """Run mvn into a sibling temp dir, then rename it to `dest` (atomic publish)."""
    tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=dest.parent))
    try:
        env = {k: v for k, v in os.environ.items() if k != "MAVEN_ARGS"}
        try:
            proc = subprocess.run(
                _mvn_command(version, tmp),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=MVN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.output if isinstance(exc.output, str) else ""
            msg = f"mvn timed out after {MVN_TIMEOUT_S:.0f}s:\n{tail(out)}"
            raise LocalKafkaError(msg) from exc
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        if proc.returncode != 0 or not any(j.startswith("kafka_2.13-") for j in jars):
            raise LocalKafkaError(
                f"mvn failed to fetch Kafka {version} (rc={proc.returncode}):\n{tail(proc.stdout)}"
            )
        (tmp / MARKER).write_text(
            json.dumps({"version": version, "pom": _pom_digest(), "jars": jars}, indent=1)
        )
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        stale = dest.with_name(f"{tmp.name}.stale")
        if dest.exists():  # stale (older pom) or incomplete: move aside, then swap in
            os.rename(dest, stale)
        os.rename(tmp, dest)
        shutil.rmtree(stale, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def ensure_jars(version: str = DEFAULT_VERSION, cache_dir: Path | None = None) -> Path:
    """Return `<cache>/kafka-<version>/libs`, running mvn only if it is not complete yet.

    Safe to call concurrently from several processes: an fcntl lock serialises
    the download, and the loser re-checks the marker after acquiring it.
    """
    libs = (cache_dir or jar_cache_root()) / f"kafka-{version}" / "libs"
    if _is_complete(libs, version):
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    with open(libs.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _is_complete(libs, version):
                _download(version, libs)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return libs
