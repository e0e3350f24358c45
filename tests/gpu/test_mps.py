"""The real MPS daemon (worker.tools.mps) on a GPU machine: a CUDA client started with the
environment it hands on runs through it (the daemon then lists a server) and computes the
same as without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from worker.tools.mps import CONTROL, MpsDaemon

CLIENT = ("import torch; g = torch.Generator().manual_seed(0); "
          "a = torch.randn(256, 256, generator=g); "
          "print(float((a.cuda() @ a.cuda()).sum().cpu()), float((a @ a).sum()))")


@pytest.mark.skipif(shutil.which(CONTROL) is None, reason=f"{CONTROL} (NVIDIA driver) not here")
def test_a_cuda_client_runs_through_the_daemon() -> None:
    daemon = MpsDaemon()
    env = daemon.start()
    try:
        out = subprocess.run([sys.executable, "-c", CLIENT], env=os.environ | env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        servers = daemon._control("get_server_list\n").stdout.split()
    finally:
        daemon.stop()
    on_gpu, on_cpu = map(float, out.split())
    assert abs(on_gpu - on_cpu) <= 1e-3 * max(1.0, abs(on_cpu))
    assert servers and all(s.isdigit() for s in servers), servers  # the client's MPS server
