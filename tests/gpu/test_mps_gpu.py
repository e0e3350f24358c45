"""The real MPS daemon (worker.tools.mps) on a GPU machine: a CUDA client started with the
environment it hands on runs through it (the daemon then lists a server) and computes the
same as without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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
        servers = daemon.servers()
    finally:
        daemon.stop()
    on_gpu, on_cpu = map(float, out.split())
    assert abs(on_gpu - on_cpu) <= 1e-3 * max(1.0, abs(on_cpu))
    assert servers and all(s.isdigit() for s in servers), servers  # the client's MPS server


@pytest.mark.skipif(shutil.which(CONTROL) is None, reason=f"{CONTROL} (NVIDIA driver) not here")
def test_run_with_mps_answers_every_job_through_kafka(tmp_path: Path) -> None:
    """`trt-worker run --gpus 1 --procs-per-gpu 2 --mps` against a real broker: both
    processes run through the MPS server (the supervisor's daemon lists one), every job
    is answered, SIGTERM stops the group and the daemon with exit code 0."""
    import signal

    from tests.harness.workers import fresh_topics, keys_of, read_topic, worker_config, worker_env
    from worker.bundled import samples_dir
    from worker.devkit.local_kafka import kafka_from_env_or_local
    from worker.tools.produce import produce_folder

    with kafka_from_env_or_local() as bootstrap:
        topics = fresh_topics(bootstrap, partitions=4)
        cfg = worker_config(bootstrap, topics)
        sent = produce_folder(cfg, samples_dir(), count=200, prefix="mps-")
        env = worker_env(cfg, KTW_MODEL__BACKEND="torch", KTW_MODEL__PREPROCESS="gpu",
                         KTW_MODEL__JPEG_ROUNDTRIP="false", KTW_ENGINES__USE_CACHE="false")
        log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([sys.executable, "-m", "worker", "run", "--gpus", "1",
                                 "--procs-per-gpu", "2", "--mps"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            results = read_topic(bootstrap, topics.results,
                                 until=lambda m: len(set(keys_of(m))) >= len(sent), timeout=180)
            servers = _servers_of((tmp_path / "run.log").read_text(errors="replace"))
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(90)
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()
        text = (tmp_path / "run.log").read_text(errors="replace")
        assert {s.id for s in sent} <= set(keys_of(results)), text[-3000:]
        assert code == 0, text[-3000:]
        assert "mps_started" in text and "mps_stopped" in text
        assert servers and all(x.isdigit() for x in servers), servers  # clients connected


def _servers_of(log: str) -> list[str]:
    """The MPS servers the supervisor's daemon runs (its pipe folder from the mps_started
    log line)."""
    import json

    for line in log.splitlines():
        if line.startswith("{") and '"mps_started"' in line:
            pipe = json.loads(line)["pipe"]
            out = subprocess.run([shutil.which(CONTROL) or CONTROL], input="get_server_list\n",
                                 env=os.environ | {"CUDA_MPS_PIPE_DIRECTORY": pipe},
                                 capture_output=True, text=True, timeout=30, check=False)
            return out.stdout.split()
    return []
