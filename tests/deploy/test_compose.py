"""deploy/compose: `docker compose config` (client only: no Docker daemon needed) validates the
file against the Compose specification and resolves it; the resolved model is then checked
against the worker's config, Prometheus' scrape config and Grafana's provisioning."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, TOOLS, find_tool, missing, run

COMPOSE = DEPLOY / "compose"
FILE = COMPOSE / "docker-compose.yml"
GPU = COMPOSE / "docker-compose.gpu.yml"


def seconds(duration: str) -> float:
    """A Go duration as compose prints it ("2m30s") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def compose_cmd() -> tuple[list[str], dict[str, str]]:
    """`docker compose` with the plugin from deploy/tools (DOCKER_CONFIG), else the user's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRT_", "GRAFANA_"))}
    docker = find_tool("docker")
    if docker is not None:
        if (TOOLS / "docker" / "cli-plugins" / "docker-compose").exists():
            env["DOCKER_CONFIG"] = str(TOOLS / "docker")
        if run([docker, "compose", "version"], env=env).returncode == 0:
            return [docker, "compose"], env
    standalone = find_tool("docker-compose")
    if standalone is not None and "v2." in run([standalone, "version"]).stdout:
        return [standalone], env
    missing("docker compose (v2)")
    raise AssertionError("unreachable")


def config(*files: Path) -> dict[str, Any]:
    cmd, env = compose_cmd()
    args = [a for f in files for a in ("-f", str(f))]
    proc = run([*cmd, *args, "config", "--format", "json"], env=env)
    assert proc.returncode == 0, proc.stderr
    model: dict[str, Any] = json.loads(proc.stdout)
    return model


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return config(FILE)


def test_compose_config_is_valid_without_a_daemon(model: dict[str, Any]) -> None:
    assert set(model["services"]) == {"kafka", "topics", "engines", "worker", "prometheus",
                                      "grafana"}


def test_gpu_override_is_valid() -> None:
    m = config(FILE, GPU)
    for name in ("worker", "engines"):
        svc = m["services"][name]
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and device["count"] == 1
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile.cuda"
        assert svc["image"].endswith("-cuda")
    assert "deploy" not in m["services"]["topics"]


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    """`config` really validates: a misspelt key fails."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(FILE.read_text().replace("stop_grace_period:", "stop_grace_periodd:"))
    cmd, env = compose_cmd()
    proc = run([*cmd, "-f", str(bad), "config", "--quiet"], env=env)
    assert proc.returncode != 0
    assert "stop_grace_periodd" in proc.stderr


def test_kafka_is_a_single_kraft_node(model: dict[str, Any]) -> None:
    kafka = model["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert len(env["CLUSTER_ID"]) == 22  # a base64 UUID, as kafka-storage format wants
    assert "INTERNAL://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert kafka["healthcheck"]["test"]


def test_topics_then_engines_then_worker(model: dict[str, Any]) -> None:
    s = model["services"]
    assert s["topics"]["command"] == ["topics", "create", "--partitions", "6",
                                      "--replication-factor", "1"]
    assert s["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert s["engines"]["command"] == ["engines", "build"]
    assert s["worker"]["command"] == ["run"]
    deps = s["worker"]["depends_on"]
    assert deps["topics"]["condition"] == "service_completed_successfully"
    assert deps["engines"]["condition"] == "service_completed_successfully"
    for name in ("topics", "engines", "worker"):
        svc = s[name]
        assert svc["read_only"] is True
        mounts = {v["target"]: v for v in svc["volumes"]}
        assert mounts["/var/cache/trt-worker"]["source"] == "engine-cache"
        assert mounts["/etc/trt-worker/config.toml"]["source"] == str(COMPOSE / "worker.toml")
        assert svc["environment"]["KTW_CONFIG_FILE"] == "/etc/trt-worker/config.toml"


def test_worker_config_and_grace(model: dict[str, Any], clean_env: pytest.MonkeyPatch) -> None:
    from worker.config import load_config

    cfg = load_config(COMPOSE / "worker.toml")
    assert cfg.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.metrics.port == 9464
    worker = model["services"]["worker"]
    assert seconds(worker["stop_grace_period"]) > cfg.commit.shutdown_timeout_s
    assert {p["target"] for p in worker["ports"]} == {cfg.metrics.port}


def test_prometheus_scrapes_every_worker(model: dict[str, Any]) -> None:
    prom = model["services"]["prometheus"]
    mounts = {v["target"]: v["source"] for v in prom["volumes"]}
    file = Path(mounts["/etc/prometheus/prometheus.yml"])
    assert file == COMPOSE / "prometheus.yml"
    scrape = yaml.safe_load(file.read_text())["scrape_configs"]
    (job,) = [j for j in scrape if j["job_name"] == "trt-worker"]
    assert job["metrics_path"] == "/metrics"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == 9464 and sd["type"] == "A"


def test_grafana_is_provisioned_with_the_dashboard(model: dict[str, Any]) -> None:
    grafana = model["services"]["grafana"]
    mounts = {v["target"]: Path(v["source"]) for v in grafana["volumes"] if v["type"] == "bind"}
    provisioning = mounts["/etc/grafana/provisioning"]
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    prom_port = {p["target"] for p in model["services"]["prometheus"]["ports"]}
    assert prom_port == {9090}
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "trt-worker.yml").read_text())[
        "providers"]
    path = provider["options"]["path"]
    assert mounts[path] == DEPLOY / "grafana"
    assert (mounts[path] / "trt-worker-dashboard.json").is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(path)


def test_worker_toml_keys(clean_env: pytest.MonkeyPatch) -> None:
    """worker.toml carries only what the compose deployment needs to differ from the defaults."""
    data = tomllib.loads((COMPOSE / "worker.toml").read_text())
    assert data["kafka"]["bootstrap_servers"] == "kafka:9092"
    assert data["commit"]["shutdown_timeout_s"] == 120
