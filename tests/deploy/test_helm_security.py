"""The chart's hardening, under helm 3 and helm 4: no secret in the ConfigMap (a secret in
`config` fails the render; credentials come from `existingSecret`, TLS files from a mounted
Secret), a NetworkPolicy that lets only the Prometheus namespace in, a PodDisruptionBudget and
resource requests and limits by default, the engine cache read-only in the worker (it loads code
from it) and writable in the build only, and images by digest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, CI_VALUES, Helm, Manifests, env_of

POD = "t-trt-worker-0"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def refused(helm: Helm, *args: str, values: dict[str, Any] | None = None,
            tmp: Path | None = None) -> str:
    proc = helm.template(*args, values=values, tmp=tmp)
    assert proc.returncode != 0, f"rendered, but should not have: {args} {values}"
    return proc.stderr


def load_worker_config(m: Manifests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       secrets: dict[str, dict[str, str]]) -> Any:
    """The worker's load_config() over the rendered ConfigMap and the worker container's env,
    secretKeyRef entries resolved from ``secrets`` (Secret name -> key -> value) as the kubelet
    would."""
    from worker.config import load_config

    file = tmp_path / "config.toml"
    file.write_text(m.one("ConfigMap")["data"]["config.toml"])
    for name, value in env_of(m.container()).items():
        if isinstance(value, dict):
            if value.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                monkeypatch.setenv(name, POD)
            elif "secretKeyRef" in value:
                ref = value["secretKeyRef"]
                monkeypatch.setenv(name, secrets[ref["name"]][ref["key"]])
            continue
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("KTW_CONFIG_FILE", str(file))
    return load_config(file)


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in container["volumeMounts"]}


# --- no secret in config -----------------------------------------------------------------------


@pytest.mark.parametrize(("config", "path"), [
    ({"kafka": {"sasl_password": "hunter2"}}, "config.kafka.sasl_password"),
    ({"kafka": {"extra": {"ssl.key.password": "x"}}}, "config.kafka.extra.ssl.key.password"),
    ({"kafka": {"consumer_extra": {"sasl.oauthbearer.client.SECRET": "x"}}},
     "config.kafka.consumer_extra.sasl.oauthbearer.client.SECRET"),
    ({"kafka": {"producer_extra": {"ssl.Key.Pem": "-----BEGIN"}}},
     "config.kafka.producer_extra.ssl.Key.Pem"),
    ({"tracing": {"headers": [{"name": "x", "ApiToken": "t"}]}},
     "config.tracing.headers[0].ApiToken"),
    ({"a": {"b": {"c": {"db_Password": ""}}}}, "config.a.b.c.db_Password"),
])
def test_a_secret_in_config_fails_the_render(helm: Helm, tmp_path: Path,
                                             config: dict[str, Any], path: str) -> None:
    """A ConfigMap is no place for a secret: a key naming one, at any depth and in any case,
    fails the render and says where it is and what to use instead."""
    err = refused(helm, values={"config": config}, tmp=tmp_path)
    assert path in err
    assert "existingSecret" in err


def test_token_settings_that_are_not_secrets_still_render(helm: Helm, tmp_path: Path) -> None:
    """The text engines' token_buckets and overlap_tokens are not secrets ("token" counts only
    at a key's end), while an access token is refused."""
    config: dict[str, Any] = {
        "moderation": {"text": {"token_buckets": [16, 32], "overlap_tokens": 8}}}
    m = helm.render(values={"config": config}, tmp=tmp_path)
    assert m.config_toml()["moderation"]["text"]["overlap_tokens"] == 8
    config["moderation"]["text"]["access_token"] = "t"
    assert "config.moderation.text.access_token" in refused(helm, values={"config": config},
                                                            tmp=tmp_path)


# --- credentials from an existing Secret -------------------------------------------------------


EXISTING: dict[str, Any] = {
    "existingSecret": {"name": "kafka-credentials", "saslUsernameKey": "username",
                       "saslPasswordKey": "password",
                       "extra": {"ssl.key.password": "key-pass",
                                 "sasl.oauthbearer.client.secret": "oauth"}},
    "config": {"kafka": {"bootstrap_servers": "k:9093", "security_protocol": "SASL_SSL",
                         "sasl_mechanism": "SCRAM-SHA-512",
                         "extra": {"socket.keepalive.enable": "true"}}},
}
SECRET = {"kafka-credentials": {"username": "svc-worker", "password": "s3cr3t-pw",
                                "key-pass": "k3y-pw", "oauth": "0auth-s3cret"}}


def test_existing_secret_reaches_the_worker_by_reference(
        helm: Helm, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render(values=EXISTING, tmp=tmp_path)
    env = env_of(m.container())
    ref = {"name": "kafka-credentials"}
    assert env["KTW_KAFKA__SASL_USERNAME"] == {"secretKeyRef": {**ref, "key": "username"}}
    assert env["KTW_KAFKA__SASL_PASSWORD"] == {"secretKeyRef": {**ref, "key": "password"}}
    assert env["KTW_KAFKA__EXTRA__SSL.KEY.PASSWORD"] == {
        "secretKeyRef": {**ref, "key": "key-pass"}}
    # The engine build does not talk to Kafka: it gets no credentials.
    assert not [k for k in env_of(m.container("engines-build")) if "SASL" in k or "EXTRA" in k]
    for value in SECRET["kafka-credentials"].values():
        assert value not in m.text

    # The worker reads them where the config scheme says, next to the ConfigMap's own settings.
    cfg = load_worker_config(m, tmp_path, clean_env, SECRET)
    assert cfg.kafka.sasl_username == "svc-worker"
    assert cfg.kafka.sasl_password.get_secret_value() == "s3cr3t-pw"
    extra = cfg.kafka.extra
    assert extra["ssl.key.password"].get_secret_value() == "k3y-pw"
    assert extra["sasl.oauthbearer.client.secret"].get_secret_value() == "0auth-s3cret"
    assert extra["socket.keepalive.enable"] == "true"


@pytest.mark.parametrize(("values", "message"), [
    ({"existingSecret": {"name": "kafka-credentials"}}, "no key of it is used"),
    ({"existingSecret": {"saslPasswordKey": "password"}}, "not existingSecret.name"),
])
def test_existing_secret_half_set_fails(helm: Helm, tmp_path: Path, values: dict[str, Any],
                                        message: str) -> None:
    assert message in refused(helm, values=values, tmp=tmp_path)


# --- TLS files from a Secret -------------------------------------------------------------------


TLS: dict[str, Any] = {"tls": {"enabled": True, "secretName": "kafka-client-tls"},
       "config": {"kafka": {"bootstrap_servers": "k:9093", "security_protocol": "SSL"}}}


def test_tls_secret_is_mounted_and_the_config_points_at_it(
        helm: Helm, tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    m = helm.render(values=TLS, tmp=tmp_path)
    worker = mounts(m.container())
    assert worker["kafka-tls"]["readOnly"] is True
    base = worker["kafka-tls"]["mountPath"]
    assert "kafka-tls" not in mounts(m.container("engines-build"))
    volume = {v["name"]: v for v in m.pod()["volumes"]}["kafka-tls"]["secret"]
    assert volume["secretName"] == "kafka-client-tls"
    assert volume["defaultMode"] == 0o440
    files = {i["key"]: f"{base}/{i['path']}" for i in volume["items"]}
    assert set(files) == {"ca.crt", "tls.crt", "tls.key"}

    cfg = load_worker_config(m, tmp_path, clean_env, {})
    assert cfg.kafka.security_protocol == "SSL"
    assert cfg.kafka.ssl_ca_location == files["ca.crt"]
    assert cfg.kafka.extra["ssl.certificate.location"] == files["tls.crt"]
    assert cfg.kafka.extra["ssl.key.location"] == files["tls.key"]

    # TLS without a client certificate: the CA only.
    m = helm.render(values={**TLS, "tls": {**TLS["tls"], "certKey": ""}}, tmp=tmp_path)
    volume = {v["name"]: v for v in m.pod()["volumes"]}["kafka-tls"]["secret"]
    assert [i["key"] for i in volume["items"]] == ["ca.crt"]
    assert "extra" not in m.config_toml()["kafka"]


@pytest.mark.parametrize(("change", "message"), [
    ({"tls": {"secretName": ""}}, "tls.secretName"),
    ({"config": {"kafka": {"security_protocol": "SASL_PLAINTEXT"}}}, "SSL or SASL_SSL"),
    ({"config": {"kafka": {"security_protocol": "SSL", "ssl_ca_location": "/x"}}},
     "config.kafka.ssl_ca_location is set by the chart"),
    ({"config": {"kafka": {"security_protocol": "SSL",
                           "extra": {"ssl.key.location": "/x"}}}},
     "config.kafka.extra.ssl.key.location is set by the chart"),
])
def test_tls_misconfiguration_fails(helm: Helm, tmp_path: Path, change: dict[str, Any],
                                    message: str) -> None:
    values = {"tls": {**TLS["tls"], **change.get("tls", {})},
              "config": change.get("config", TLS["config"])}
    assert message in refused(helm, values=values, tmp=tmp_path)


# --- network policy, disruption budget, resources ----------------------------------------------


def test_network_policy_admits_only_prometheus_to_the_metrics_port(helm: Helm,
                                                                   tmp_path: Path) -> None:
    m = helm.render()
    np = m.one("NetworkPolicy")
    pod_labels = m.workload()["spec"]["template"]["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    # Ingress only: egress is left open (no Egress policy type, no egress rules).
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert "egress" not in np["spec"]
    (rule,) = np["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    ports = {p["name"] for p in m.container()["ports"]}
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}] and "metrics" in ports

    m = helm.render("-f", str(CHART / "ci" / "secure-values.yaml"))
    np = m.one("NetworkPolicy")
    (peer,) = np["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "prometheus"}}
    assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert len(np["spec"]["egress"]) == 2

    assert not helm.render("--set", "networkPolicy.enabled=false").all("NetworkPolicy")


def test_disruption_budget_is_on_by_default(helm: Helm) -> None:
    m = helm.render()
    pdb = m.one("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    pod_labels = m.workload()["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert not helm.render("--set", "podDisruptionBudget.enabled=false").all(
        "PodDisruptionBudget")


def test_the_metrics_server_listens_on_the_pod_ip_only(helm: Helm) -> None:
    """The worker's metrics.host defaulted to every address of the pod; the chart binds it to
    the pod's IP (probes and the PodMonitor dial that), unless bindPodIP is turned off."""
    env = env_of(helm.render().container())
    assert env["KTW_METRICS__HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    off = env_of(helm.render("--set", "metrics.bindPodIP=false").container())
    assert "KTW_METRICS__HOST" not in off


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_every_container_has_cpu_and_memory_requests_and_limits(helm: Helm,
                                                                values: Path) -> None:
    m = helm.render("-f", str(values))
    pod = m.pod()
    gpu = yaml.safe_load(values.read_text()).get("gpu", {}).get("enabled", False)
    for c in pod["containers"] + pod.get("initContainers", []):
        res = c["resources"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res.get(kind, {})), (c["name"], kind, res)
        assert ("nvidia.com/gpu" in res["limits"]) == gpu


def test_a_resource_default_can_be_dropped(helm: Helm) -> None:
    m = helm.render("--set", "resources.limits.cpu=null", "--set", "gpu.enabled=true")
    assert m.container()["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": 1}


# --- engine cache: read-only where code is loaded from it --------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_engine_cache_is_read_only_in_the_worker(helm: Helm, values: Path) -> None:
    m = helm.render("-f", str(values))
    assert mounts(m.container())["engine-cache"].get("readOnly") is True
    build = mounts(m.container("engines-build"))["engine-cache"]
    assert build.get("readOnly", False) is False
    assert build["mountPath"] == mounts(m.container())["engine-cache"]["mountPath"]
    # Nothing else the worker mounts is the cache again, writable.
    writable = [v for v in m.container()["volumeMounts"]
                if v["name"] == "engine-cache" and not v.get("readOnly")]
    assert not writable


def test_without_prebuild_nothing_writes_the_cache(helm: Helm) -> None:
    m = helm.render("--set", "engineCache.prebuild=false", "--set", "engineCache.type=pvc",
                    "--set", "engineCache.existingClaim=engines")
    assert "initContainers" not in m.pod()
    assert mounts(m.container())["engine-cache"]["readOnly"] is True
    err = refused(helm, "--set", "engineCache.prebuild=false")
    assert "nothing would build the engines" in err
    helm.render("--set", "engineCache.prebuild=false", "--set", "config.engines.use_cache=false")


@pytest.mark.parametrize("blob", [{}, {"local_dir": "/var/cache/trt-worker/blobs"}])
def test_generation_blobs_may_not_go_to_the_read_only_cache(helm: Helm, tmp_path: Path,
                                                            blob: dict[str, str]) -> None:
    config: dict[str, Any] = {"processing": {"task": "generation"},
              "generation": {"random_weights": "tiny", "blob": blob}}
    err = refused(helm, values={"config": config}, tmp=tmp_path)
    assert "generation.blob.local_dir on a writable volume" in err
    config["generation"]["blob"] = {"kind": "s3", "s3_bucket": "b"}
    helm.render(values={"config": config}, tmp=tmp_path)


# --- images by digest --------------------------------------------------------------------------


def test_image_digest_overrides_the_tag(helm: Helm) -> None:
    m = helm.render("--set", f"image.digest={DIGEST}", "--set", "image.tag=latest",
                    "--set", "gpu.enabled=true")
    for name in ("worker", "engines-build"):
        assert m.container(name)["image"] == f"kafka-trt-worker@{DIGEST}"
    assert helm.render("--set", "image.tag=1.2.3").container()["image"] == \
        "kafka-trt-worker:1.2.3"
    err = refused(helm, "--set", "image.digest=sha256:abc")
    assert "digest" in err


def test_no_rendered_manifest_holds_a_secret_value(helm: Helm) -> None:
    """The hardened example: every credential is a reference, the ConfigMap holds paths."""
    m = helm.render("-f", str(CHART / "ci" / "secure-values.yaml"))
    refs = [e["valueFrom"]["secretKeyRef"] for e in m.container()["env"]
            if "secretKeyRef" in e.get("valueFrom", {})]
    assert {r["key"] for r in refs} == {"username", "password", "client-key-password"}
    assert not m.all("Secret")
    assert json.dumps(m.config_toml()).count("/etc/trt-worker-tls/") == 3
