"""Locate a Java >= 17 runtime (the Kafka 4.x broker refuses older ones)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from .errors import LocalKafkaError

MIN_JAVA_MAJOR = 17


def java_executable() -> str:
    """`$JAVA_HOME/bin/java` if JAVA_HOME is set, else `java` from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if not os.access(candidate, os.X_OK):
            raise LocalKafkaError(f"JAVA_HOME={home} but {candidate} is not executable")
        return str(candidate)
    found = shutil.which("java")
    if not found:
        raise LocalKafkaError("no Java runtime: set JAVA_HOME or put java (>= 17) on PATH")
    return found


def parse_major(version_output: str) -> int:
    """Major version from `java -version` output ('1.8.0_x' -> 8, '17.0.15' -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        raise LocalKafkaError(f"cannot parse `java -version` output: {version_output!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # pre-9 scheme: 1.8 means 8
        major = int(match.group(2))
    return major


@functools.cache
def checked_java() -> str:
    """Java executable, verified to be >= 17; cached per process."""
    java = java_executable()
    try:
        proc = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LocalKafkaError(f"cannot run {java} -version: {exc}") from exc
    major = parse_major(proc.stderr + proc.stdout)
    if major < MIN_JAVA_MAJOR:
        raise LocalKafkaError(
            f"{java} is Java {major}; the Kafka 4.x broker needs Java >= {MIN_JAVA_MAJOR} "
            "(set JAVA_HOME to a newer JDK)"
        )
    return java
