"""NVIDIA MPS (the CUDA Multi-Process Service) for several worker processes on one GPU.

Without MPS each worker process has its own CUDA context and the GPU time-slices between them:
one process's nvJPEG decode never runs beside another's engine. Under MPS the processes' work
goes through one server and runs concurrently. On one H200 (bench/NOTES.md, 2026-12-01 late)
four processes did 17.2k frames/s without MPS and 31.5k with it; two did 22.8k with it.

`trt-worker run --gpus N --procs-per-gpu K --mps` starts a private control daemon (its pipe
and log folders in a fresh temporary folder, handed to the children as
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``) and quits it after the children
exit. The daemon sees exactly the GPUs in use (``CUDA_VISIBLE_DEVICES`` set to them) and its
server renumbers them from 0, so each child is given its GPU's position in that list, not the
GPU's own id (NVIDIA's MPS guide: a client keeping the daemon's ids would get an error).
Where the host or the cluster already runs MPS (the NVIDIA device plugin's MPS sharing connects
the pod to its daemon), leave ``--mps`` out: the children use that one.
The binary ships with the NVIDIA driver; nothing is installed here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import structlog

from worker.exceptions import ConfigError

log = structlog.get_logger("worker")

CONTROL = "nvidia-cuda-mps-control"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


class MpsDaemon:
    """A private MPS control daemon: ``start()`` returns the environment its clients need."""

    def __init__(self, devices: list[str] | None = None, binary: str | None = None,
                 timeout_s: float = 30.0) -> None:
        """``devices``: the GPU ids (or UUIDs) the daemon's server may use (None: what this
        process sees)."""
        self.devices, self.binary, self.timeout_s = devices, binary, timeout_s
        self.root: Path | None = None
        self.env: dict[str, str] = {}

    def _control(self, command: str | None = None, *args: str, daemon: bool = False
                 ) -> subprocess.CompletedProcess[str]:
        assert self.binary is not None
        env = os.environ | self.env
        if daemon and self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        try:
            return subprocess.run([self.binary, *args], input=command, env=env,
                                  capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"--mps: {self.binary} {' '.join(args)} failed: "
                              f"{_one_line(str(exc))}") from exc

    def start(self) -> dict[str, str]:
        self.binary = self.binary or shutil.which(CONTROL)
        if self.binary is None:
            raise ConfigError(f"--mps: {CONTROL} not found on PATH (it ships with the NVIDIA "
                              "driver); run without --mps or install the driver's utilities")
        self.root = Path(tempfile.mkdtemp(prefix="trt-worker-mps-"))
        pipe, logs = self.root / "pipe", self.root / "log"
        pipe.mkdir()
        logs.mkdir()
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        try:
            started = self._control(None, "-d", daemon=True)
            if started.returncode != 0:
                self._cleanup()
                raise ConfigError(f"--mps: {CONTROL} did not start (exit {started.returncode}): "
                                  f"{_one_line(started.stderr or started.stdout)}")
            # The daemon forks and returns at once; a command through its pipe proves it
            # listens.
            listening = self._control("get_server_list\n")
            if listening.returncode != 0:
                raise ConfigError(f"--mps: {CONTROL} does not answer (exit "
                                  f"{listening.returncode}): "
                                  f"{_one_line(listening.stderr or listening.stdout)}")
        except ConfigError:
            self.stop()  # a daemon that started but does not answer is not left behind
            raise
        log.info("mps_started", pipe=str(pipe))
        return dict(self.env)

    def servers(self) -> list[str]:
        """The process ids of the MPS servers the daemon runs (one once a client connected)."""
        return self._control("get_server_list\n").stdout.split()

    def client_devices(self) -> list[str]:
        """Each GPU's ``CUDA_VISIBLE_DEVICES`` value for a client of this daemon: its position
        among ``devices``, which the daemon's server numbers from 0."""
        assert self.devices is not None, "a daemon given its devices"
        return [str(i) for i in range(len(self.devices))]

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            done = self._control("quit\n")
            log.info("mps_stopped", exit_code=done.returncode)
        except ConfigError as exc:  # the workers' exit code matters more than this
            log.warning("mps_stop_failed", error=str(exc))
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root, self.env = None, {}

    def __enter__(self) -> dict[str, str]:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
