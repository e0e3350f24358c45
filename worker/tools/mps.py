"""NVIDIA MPS (the CUDA Multi-Process Service) for several worker processes on one GPU.

Without MPS each worker process has its own CUDA context and the GPU time-slices between them:
one process's nvJPEG decode never runs beside another's engine. Under MPS the processes' work
goes through one server and runs concurrently (figures: docs/performance.md).

`trt-worker run --gpus N --procs-per-gpu K --mps` starts a private control daemon (its pipe
and log folders in a fresh temporary folder, handed to the children as
``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY``) and quits it after the children
exit. The daemon sees exactly the GPUs in use (``CUDA_VISIBLE_DEVICES`` set to them) and its
server renumbers them from 0, so each child is given its GPU's position in that list, not the
GPU's own id (NVIDIA's MPS guide: a client keeping the daemon's ids would get an error).
Where the host or the cluster already runs MPS (the NVIDIA device plugin's MPS sharing connects
the pod to its daemon), leave ``--mps`` out: the children use that one.
The binary ships with the NVIDIA driver; nothing is installed here.

A supervisor killed outright (SIGKILL, the OOM killer) cannot quit its daemon, which would then
run on beside later ones until a reboot. So each folder records its supervisor's pid, and every
start first quits the daemons of folders whose supervisor is gone, and removes those folders.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import structlog

from worker.exceptions import ConfigError, one_line

log = structlog.get_logger("worker")

CONTROL = "nvidia-cuda-mps-control"
PREFIX = "trt-worker-mps-"  # the private folders, in the temporary directory
OWNER = "owner.pid"  # in each folder: the pid of the process that started its daemon


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return True


def _folders(root: Path) -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}


class MpsDaemon:
    """A private MPS control daemon: ``start()`` returns the environment its clients need."""

    def __init__(self, devices: list[str] | None = None, binary: str | None = None,
                 timeout_s: float = 30.0) -> None:
        """``devices``: the GPU ids (or UUIDs) the daemon's server may use (None: what this
        process sees)."""
        self.devices, self.binary, self.timeout_s = devices, binary, timeout_s
        self.root: Path | None = None
        self.env: dict[str, str] = {}

    def _control(self, command: str | None = None, *args: str, daemon: bool = False,
                 folders: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the control program (``folders``: another daemon's than this one's)."""
        assert self.binary is not None
        env = os.environ | (self.env if folders is None else folders)
        if daemon and self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        try:
            return subprocess.run([self.binary, *args], input=command, env=env,
                                  capture_output=True, text=True, timeout=self.timeout_s,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            raise ConfigError(f"--mps: {self.binary} {' '.join(args)} failed: "
                              f"{one_line(exc)}") from exc

    def start(self) -> dict[str, str]:
        self.binary = self.binary or shutil.which(CONTROL)
        if self.binary is None:
            raise ConfigError(f"--mps: {CONTROL} not found on PATH (it ships with the NVIDIA "
                              "driver); run without --mps or install the driver's utilities")
        self._reap_orphans()
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.root / OWNER).write_text(str(os.getpid()))
        self.env = _folders(self.root)
        for folder in self.env.values():
            Path(folder).mkdir()
        try:
            started = self._control(None, "-d", daemon=True)
            if started.returncode != 0:
                self._cleanup()
                raise ConfigError(f"--mps: {CONTROL} did not start (exit {started.returncode}): "
                                  f"{one_line(started.stderr or started.stdout)}")
            # The daemon forks and returns at once; a command through its pipe proves it
            # listens.
            listening = self._control("get_server_list\n")
            if listening.returncode != 0:
                raise ConfigError(f"--mps: {CONTROL} does not answer (exit "
                                  f"{listening.returncode}): "
                                  f"{one_line(listening.stderr or listening.stdout)}")
        except ConfigError:
            self.stop()  # a daemon that started but does not answer is not left behind
            raise
        log.info("mps_started", pipe=self.env["CUDA_MPS_PIPE_DIRECTORY"])
        return dict(self.env)

    def _reap_orphans(self) -> None:
        """Quit the daemons whose supervisor died without quitting them; remove their
        folders. A folder without an owner (being created, or made by an older version) is
        left alone."""
        for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
            try:
                owner = int((root / OWNER).read_text())
            except (OSError, ValueError):
                continue
            if _alive(owner):
                continue
            try:
                code: int | None = self._control("quit\n", folders=_folders(root)).returncode
            except ConfigError:
                code = None
            shutil.rmtree(root, ignore_errors=True)
            log.warning("mps_orphan_reaped", folder=str(root), owner_pid=owner,
                        quit_exit_code=code)

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
