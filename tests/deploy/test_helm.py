"""The Helm chart (deploy/helm/trt-worker) under helm 3 and helm 4: lint, what each value set
renders, what must refuse to render, and that the worker accepts the config the chart writes."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import (
    CHART,
    CI_VALUES,
    DEPLOY,
    Helm,
    Manifests,
    env_of,
    run,
    tool,
)

POD = "t-trt-worker-0"


def worker_config(m: Manifests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The worker's own load_config() over the rendered ConfigMap and the container's env."""
    from worker.config import load_config

    file = tmp_path / "config.toml"
    file.write_text(m.one("ConfigMap")["data"]["config.toml"])
    for name, value in env_of(m.container()).items():
        if isinstance(value, dict):  # valueFrom
            if value.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                monkeypatch.setenv(name, POD)
            continue
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("KTW_CONFIG_FILE", str(file))
    return load_config(file)


# --- lint --------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_lint_strict(helm: Helm, values: Path) -> None:
    proc = run([helm.path, "lint", "--strict", str(CHART), "-f", str(values)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_ci_value_sets_cover_the_modes() -> None:
    names = {p.stem for p in CI_VALUES}
    assert {"default-values", "exactly-once-values", "static-membership-values", "gpu-values",
            "keda-values", "full-values", "generation-values", "secure-values"} <= names


def test_install_dry_run_renders_the_notes(tmp_path: Path) -> None:
    """`helm install --dry-run=client` renders everything, NOTES.txt included (helm 4: helm 3
    still asks a cluster for its version on a dry run, so it cannot run here)."""
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = run([tool("helm4"), "install", "t", str(CHART), "--dry-run=client",
                "-f", str(CHART / "ci" / "full-values.yaml")], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "StatefulSet t-trt-worker: guarantee exactly-once" in proc.stdout
    assert "between 2 and 8 pods" in proc.stdout


# --- what each value set renders ---------------------------------------------------------------


def test_default_is_an_at_least_once_deployment(helm: Helm, tmp_path: Path,
                                                clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render()
    assert m.kinds() == ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget",
                         "Service", "ServiceAccount"]
    dep = m.one("Deployment")
    assert dep["spec"]["replicas"] == 1
    pod = m.pod()
    # Grace = commit.shutdown_timeout_s (120, the worker's default) + 30.
    assert pod["terminationGracePeriodSeconds"] == 150
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False

    c = m.container()
    assert c["image"] == "kafka-trt-worker:0.1.0-cpu"
    assert c["args"] == ["run", "--config", "/etc/trt-worker/config.toml"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "nvidia.com/gpu" not in str(c.get("resources"))

    env = env_of(c)
    assert env["KTW_KAFKA__INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KTW_PROCESSING__GUARANTEE"] == "at-least-once"
    assert env["KTW_METRICS__PORT"] == "9464"
    assert env["KTW_ENGINES__CACHE_DIR"] == "/var/cache/trt-worker/engines"
    assert "KTW_KAFKA__STATIC_MEMBERSHIP" not in env

    # The config file is the ConfigMap, mounted where --config points.
    mounts = {v["name"]: v["mountPath"] for v in c["volumeMounts"]}
    assert mounts["config"] == "/etc/trt-worker"
    assert mounts["engine-cache"] == "/var/cache/trt-worker"
    assert mounts["tmp"] == "/tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == m.one("ConfigMap")["metadata"]["name"]
    assert "emptyDir" in volumes["engine-cache"] and "emptyDir" in volumes["tmp"]

    # The engine cache is built by an init container with the same config, env and mounts,
    # but for the cache, which only the init container may write.
    init = m.container("engines-build")
    assert init["args"] == ["engines", "build", "--config", "/etc/trt-worker/config.toml"]
    assert env_of(init) == env
    writable = {"name": "engine-cache", "mountPath": "/var/cache/trt-worker", "readOnly": False}
    assert init["volumeMounts"] == [writable if v["name"] == "engine-cache" else v
                                    for v in c["volumeMounts"]]

    # The metrics Service reaches the pods' metrics port.
    svc = m.one("Service")
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()

    cfg = worker_config(m, tmp_path, clean_env)
    assert cfg.processing.guarantee == "at-least-once"
    assert cfg.kafka.instance_id == POD
    assert cfg.kafka.static_membership is False
    assert cfg.metrics.port == 9464
    assert str(cfg.engines.cache_dir) == "/var/cache/trt-worker/engines"
    assert cfg.commit.shutdown_timeout_s == 120


def test_exactly_once_is_a_statefulset_named_by_pod(helm: Helm, tmp_path: Path,
                                                    clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render("-f", str(CHART / "ci" / "exactly-once-values.yaml"))
    assert not m.all("Deployment")
    sts = m.one("StatefulSet")
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = [s for s in m.all("Service") if s["spec"].get("clusterIP") == "None"]
    assert [s["metadata"]["name"] for s in headless] == [sts["spec"]["serviceName"]]
    env = env_of(m.container())
    assert env["KTW_KAFKA__INSTANCE_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KTW_PROCESSING__GUARANTEE"] == "exactly-once"
    assert "KTW_KAFKA__STATIC_MEMBERSHIP" not in env
    # One engine-cache claim per pod.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "engine-cache"
    assert "engine-cache" not in {v["name"] for v in m.pod()["volumes"]}

    cfg = worker_config(m, tmp_path, clean_env)
    assert cfg.processing.guarantee == "exactly-once"
    assert cfg.kafka.instance_id == POD


def test_static_membership_is_a_statefulset(helm: Helm, tmp_path: Path,
                                            clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render("-f", str(CHART / "ci" / "static-membership-values.yaml"))
    m.one("StatefulSet")
    env = env_of(m.container())
    assert env["KTW_KAFKA__STATIC_MEMBERSHIP"] == "true"
    assert env["KTW_PROCESSING__GUARANTEE"] == "at-least-once"
    cfg = worker_config(m, tmp_path, clean_env)
    assert cfg.kafka.static_membership is True
    assert cfg.kafka.instance_id == POD
    assert cfg.kafka.session_timeout_ms == 60000


def test_gpu_gets_one_gpu_per_pod(helm: Helm) -> None:
    m = helm.render("-f", str(CHART / "ci" / "gpu-values.yaml"))
    for name in ("worker", "engines-build"):
        res = m.container(name)["resources"]
        assert res["limits"]["nvidia.com/gpu"] == 1
        assert res["limits"]["memory"] == "24Gi"  # the values' own limits are kept
        assert res["requests"] == {"cpu": "4", "memory": "16Gi"}
    pod = m.pod()
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    assert m.container()["image"] == "kafka-trt-worker:0.1.0-cuda"


def test_gpu_resource_name_is_configurable(helm: Helm) -> None:
    m = helm.render("--set", "gpu.enabled=true", "--set", "gpu.resourceName=amd.com/gpu")
    assert m.container()["resources"]["limits"]["amd.com/gpu"] == 1
    assert "nvidia.com/gpu" not in m.container()["resources"]["limits"]


def test_keda_scaled_object(helm: Helm) -> None:
    m = helm.render("-f", str(CHART / "ci" / "keda-values.yaml"))
    so = m.one("ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    dep = m.one("Deployment")
    assert "replicas" not in dep["spec"]  # KEDA owns it
    assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                            "name": dep["metadata"]["name"]}
    assert so["spec"]["minReplicaCount"] == 1
    assert so["spec"]["maxReplicaCount"] == 24  # topic.partitions
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"] == {
        "bootstrapServers": "broker-1:9093,broker-2:9093", "consumerGroup": "trt-worker",
        "topic": "moderation.jobs", "lagThreshold": "200", "activationLagThreshold": "0",
        "offsetResetPolicy": "earliest", "sasl": "scram_sha512", "tls": "enable"}
    assert trigger["authenticationRef"] == {"name": "kafka-scram"}
    pm = m.one("PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pm["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"
    assert pm["spec"]["selector"]["matchLabels"].items() <= \
        dep["spec"]["template"]["metadata"]["labels"].items()
    m.one("PodDisruptionBudget")
    # The SASL password comes from a Secret, next to the chart's own env.
    assert env_of(m.container())["KTW_KAFKA__SASL_PASSWORD"] == {
        "secretKeyRef": {"name": "kafka-credentials", "key": "password"}}


def test_keda_targets_the_statefulset_and_the_generation_topic(helm: Helm) -> None:
    m = helm.render("-f", str(CHART / "ci" / "full-values.yaml"))
    so = m.one("ScaledObject")
    assert so["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 8)
    assert so["spec"]["triggers"][0]["metadata"]["consumerGroup"] == "trt-moderation"
    assert "replicas" not in m.one("StatefulSet")["spec"]
    assert m.pod()["terminationGracePeriodSeconds"] == 400

    gen = helm.render("-f", str(CHART / "ci" / "generation-values.yaml"))
    meta = gen.one("ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert (meta["topic"], meta["consumerGroup"]) == ("generation.jobs", "trt-generation")
    volumes = {v["name"]: v for v in gen.pod()["volumes"]}
    assert volumes["engine-cache"]["persistentVolumeClaim"] == {"claimName": "trt-engines"}


def test_grace_follows_the_shutdown_timeout(helm: Helm) -> None:
    m = helm.render("--set", "config.commit.shutdown_timeout_s=300")
    assert m.pod()["terminationGracePeriodSeconds"] == 330
    m = helm.render("--set-json", "config.commit.shutdown_timeout_s=90.5")
    assert m.pod()["terminationGracePeriodSeconds"] == 121
    m = helm.render("--set", "terminationGracePeriodSeconds=121")
    assert m.pod()["terminationGracePeriodSeconds"] == 121


def test_config_change_rolls_the_pods(helm: Helm) -> None:
    a = helm.render()
    b = helm.render("--set", "config.batch.max_batch_size=32")
    key = "checksum/config"
    assert a.workload()["spec"]["template"]["metadata"]["annotations"][key] != \
        b.workload()["spec"]["template"]["metadata"]["annotations"][key]
    assert b.config_toml()["batch"]["max_batch_size"] == 32


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_worker_accepts_every_rendered_config(helm: Helm, values: Path, tmp_path: Path,
                                              clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render("-f", str(values))
    cfg = worker_config(m, tmp_path, clean_env)
    assert cfg.kafka.instance_id == POD


def test_the_example_config_renders_and_loads(helm: Helm, tmp_path: Path,
                                              clean_env: pytest.MonkeyPatch) -> None:
    """deploy/config.example.toml, every key, as chart values: the worker loads the result."""
    example = tomllib.loads((DEPLOY / "config.example.toml").read_text())
    m = helm.render(values={"config": example}, tmp=tmp_path)
    cfg = worker_config(m, tmp_path, clean_env)
    assert cfg.kafka.extra == {"socket.keepalive.enable": "true"}
    assert cfg.batch.max_batch_size == example["batch"]["max_batch_size"]
    assert "ads" in cfg.moderation.policies


# --- what must not render -----------------------------------------------------------------------


def refused(helm: Helm, *args: str) -> str:
    proc = helm.template(*args)
    assert proc.returncode != 0, f"rendered, but should not have: {args}"
    return proc.stderr


@pytest.mark.parametrize("grace", [60, 120])
def test_grace_at_or_below_the_shutdown_timeout_fails(helm: Helm, grace: int) -> None:
    err = refused(helm, "--set", f"terminationGracePeriodSeconds={grace}")
    assert "terminationGracePeriodSeconds" in err and "shutdown_timeout_s" in err


def test_grace_below_a_raised_shutdown_timeout_fails(helm: Helm) -> None:
    err = refused(helm, "--set", "config.commit.shutdown_timeout_s=300",
                  "--set", "terminationGracePeriodSeconds=200")
    assert "(200) must be above commit.shutdown_timeout_s (300)" in err


def test_keda_max_replicas_above_partitions_fails(helm: Helm) -> None:
    err = refused(helm, "--set", "keda.enabled=true", "--set", "topic.partitions=12",
                  "--set", "keda.maxReplicaCount=13")
    assert "keda.maxReplicaCount (13) is above topic.partitions (12)" in err
    helm.render("--set", "keda.enabled=true", "--set", "topic.partitions=12",
                "--set", "keda.maxReplicaCount=12")


def test_keda_min_above_max_fails(helm: Helm) -> None:
    err = refused(helm, "--set", "keda.enabled=true", "--set", "keda.minReplicaCount=5",
                  "--set", "keda.maxReplicaCount=4")
    assert "minReplicaCount (5) is above maxReplicaCount (4)" in err


@pytest.mark.parametrize("key", ["processing.guarantee=exactly-once",
                                 "kafka.static_membership=true", "kafka.instance_id=x",
                                 "metrics.port=9000", "engines.cache_dir=/x"])
def test_settings_the_chart_owns_are_refused_in_config(helm: Helm, key: str) -> None:
    err = refused(helm, "--set", f"config.{key}")
    assert f"config.{key.split('=')[0]} is set by the chart" in err


def test_per_pod_claims_need_a_statefulset(helm: Helm) -> None:
    err = refused(helm, "--set", "engineCache.type=volumeClaimTemplate")
    assert "needs a StatefulSet" in err
    err = refused(helm, "--set", "engineCache.type=pvc")
    assert "existingClaim" in err


@pytest.mark.parametrize("args", [["--set", "guarantee=exactly_once"],
                                  ["--set", "gpu.enabeld=true"],
                                  ["--set", "topic.partitions=0"]])
def test_values_schema_refuses_typos(helm: Helm, args: list[str]) -> None:
    refused(helm, *args)
