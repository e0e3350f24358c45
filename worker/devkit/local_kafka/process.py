"""JVM process helpers: storage format, launch, readiness probe, termination."""

from __future__ import annotations

import abc
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from .errors import LocalKafkaError, tail
from .java import checked_java

HEAP_OPTS = ["-Xms128m", "-Xmx512m"]
JVM_OPTS = ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true"]


def read_tail(path: Path, max_lines: int = 80) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 64 * 1024))
            return tail(fh.read().decode("utf-8", "replace"), max_lines)
    except OSError:
        return "<no log>"


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def appended_since(path: Path, offset: int) -> bytes:
    """What was written to `path` after it had `offset` bytes (one attempt's log)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return b""


def _java_cmd(libs: Path, log4j_conf: Path, main: str, *args: str,
              heap: list[str] | None = None,
              system_properties: Mapping[str, str] | None = None) -> list[str]:
    return [
        checked_java(),
        *(HEAP_OPTS if heap is None else heap),
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile={log4j_conf}",
        *(f"-D{key}={value}" for key, value in (system_properties or {}).items()),
        "-cp",
        f"{libs}/*",  # expanded by the JVM, not a shell
        main,
        *args,
    ]


def format_storage(libs: Path, log4j_conf: Path, props: Path, cluster_id: str, log: Path,
                   extra_args: tuple[str, ...] = (), *, standalone: bool = True,
                   heap: list[str] | None = None) -> None:
    """`kafka-storage.sh format --standalone`: in 4.x the class is still kafka.tools.StorageTool.
    ``extra_args``: e.g. ``--add-scram`` (a SCRAM user in the metadata from the first start).
    ``standalone=False`` for a node of a static quorum (``controller.quorum.voters`` in its
    properties), which StorageTool formats without ``--standalone``."""
    mode = ("--standalone",) if standalone else ()
    cmd = _java_cmd(
        libs, log4j_conf, "kafka.tools.StorageTool",
        "format", *mode, "-t", cluster_id, "-c", str(props), *extra_args, heap=heap,
    )
    with open(log, "ab") as out:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=False)
    if proc.returncode != 0:
        msg = f"kafka storage format failed (rc={proc.returncode}); log {log}:\n{read_tail(log)}"
        raise LocalKafkaError(msg)


def launch_broker(libs: Path, log4j_conf: Path, props: Path, log: Path,
                  heap: list[str] | None = None,
                  system_properties: Mapping[str, str] | None = None
                  ) -> subprocess.Popen[bytes]:
    """``system_properties``: ``-D`` settings of the JVM (no secrets: the command line is
    public to every user of the machine)."""
    cmd = _java_cmd(libs, log4j_conf, "kafka.Kafka", str(props), heap=heap,
                    system_properties=system_properties)
    # setpriv's PDEATHSIG makes the kernel SIGTERM the broker if our process
    # dies without calling stop() (e.g. pytest killed by a CI timeout), so no
    # orphan JVM keeps ports and disk. setpriv execs, so the pid stays java's.
    # Caveat: the signal fires when the *thread* that started it exits.
    setpriv = shutil.which("setpriv")
    if setpriv:
        cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out)


def wait_ready(proc: subprocess.Popen[bytes], bootstrap: str, log: Path, timeout: float) -> None:
    """Block until the broker answers a metadata request listing itself."""
    from confluent_kafka import KafkaException  # lazy: only needed with a live broker
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({
        "bootstrap.servers": bootstrap,
        "log_level": 0,  # "connection refused" while the JVM boots is expected noise
        "reconnect.backoff.max.ms": 200,  # default backoff grows to 10s and delays readiness
        "socket.timeout.ms": 2000,
    })
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if proc.poll() is not None:
            raise LocalKafkaError(
                f"Kafka broker exited early (rc={proc.returncode}); log {log}:\n{read_tail(log)}"
            )
        try:
            if admin.list_topics(timeout=min(1.0, max(0.1, left))).brokers:
                return
        except KafkaException:  # _TRANSPORT / _TIMED_OUT while the JVM is still starting
            time.sleep(0.1)
    msg = f"Kafka broker not ready after {timeout:.0f}s; log {log}:\n{read_tail(log)}"
    raise LocalKafkaError(msg)


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """SIGTERM (controlled shutdown), then SIGKILL after `timeout`. True if it exited cleanly."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    # A SIGSTOPped JVM would sit on the pending SIGTERM forever; SIGCONT is harmless otherwise.
    proc.send_signal(signal.SIGCONT)
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        return False


class Runs(abc.ABC):
    """A broker or cluster as a context manager: started on entry, stopped on exit."""

    @abc.abstractmethod
    def start(self, timeout: float = 90.0) -> str:
        """Start and wait until clients are answered; the bootstrap servers."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process it started."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
