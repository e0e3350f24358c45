"""Every manifest the chart renders, validated by kubeconform against the Kubernetes API's own
schemas and the CRDs' (KEDA ScaledObject, Prometheus Operator PodMonitor), strictly (unknown
fields refused), offline: deploy/tools/install.sh writes the schemas into deploy/tools/schemas
(see deploy/tools/gen_schemas.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART, CI_VALUES, SCHEMAS, Helm, missing, run, tool

CORE = "{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}" \
       "{{ .KindSuffix }}.json"
CRDS = "crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"


def k8s_versions() -> list[str]:
    found = sorted(p.name.removeprefix("v").removesuffix("-standalone-strict")
                   for p in SCHEMAS.glob("v*-standalone-strict"))
    return found


def kubeconform(manifests: str, version: str, tmp_path: Path) -> dict[str, Any]:
    file = tmp_path / "manifests.yaml"
    file.write_text(manifests)
    proc = run([tool("kubeconform"), "-strict", "-summary", "-verbose", "-output", "json",
                "-kubernetes-version", version,
                "-schema-location", str(SCHEMAS / CORE),
                "-schema-location", str(SCHEMAS / CRDS), str(file)])
    result: dict[str, Any] = json.loads(proc.stdout)
    result["returncode"] = proc.returncode
    return result


@pytest.fixture(scope="module")
def versions() -> list[str]:
    found = k8s_versions()
    if not found or not (SCHEMAS / "crds").is_dir():
        missing(f"the kubeconform schemas ({SCHEMAS})")
    return found


@pytest.mark.parametrize("values", CI_VALUES, ids=[p.stem for p in CI_VALUES])
def test_rendered_manifests_are_valid(helm: Helm, values: Path, versions: list[str],
                                      tmp_path: Path) -> None:
    m = helm.render("-f", str(values))
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(m.text) if d)
    for version in versions:
        result = kubeconform(m.text, version, tmp_path)
        bad = [r for r in result["resources"] if r["status"] != "statusValid"]
        assert result["returncode"] == 0 and not bad, f"Kubernetes {version}: {bad}"
        assert result["summary"] == {"valid": len(kinds), "invalid": 0, "errors": 0,
                                     "skipped": 0}
        assert sorted(r["kind"] for r in result["resources"]) == kinds


def test_the_custom_resources_are_validated(helm: Helm, versions: list[str],
                                            tmp_path: Path) -> None:
    m = helm.render("-f", str(CHART / "ci" / "full-values.yaml"))
    result = kubeconform(m.text, versions[0], tmp_path)
    statuses = {r["kind"]: r["status"] for r in result["resources"]}
    assert statuses["ScaledObject"] == "statusValid"
    assert statuses["PodMonitor"] == "statusValid"
    assert statuses["StatefulSet"] == "statusValid"


def test_the_network_policy_is_validated(helm: Helm, versions: list[str],
                                         tmp_path: Path) -> None:
    m = helm.render("-f", str(CHART / "ci" / "secure-values.yaml"))
    for version in versions:
        result = kubeconform(m.text, version, tmp_path)
        statuses = {r["kind"]: r["status"] for r in result["resources"]}
        assert statuses["NetworkPolicy"] == "statusValid", (version, result)


@pytest.mark.parametrize(("kind", "field", "wrong"), [
    ("ScaledObject", "maxReplicaCount", "maxReplicas"),
    ("PodMonitor", "podMetricsEndpoints", "podMetricEndpoints"),
    ("StatefulSet", "serviceName", "serviceNam"),
    ("Service", "clusterIP", "clusterIp"),
    ("NetworkPolicy", "policyTypes", "policyType"),
])
def test_the_schemas_catch_a_misspelt_field(helm: Helm, versions: list[str], tmp_path: Path,
                                            kind: str, field: str, wrong: str) -> None:
    """The schemas are real: a misspelt field in any of the kinds fails validation."""
    m = helm.render("-f", str(CHART / "ci" / "full-values.yaml"))
    docs = m.docs
    target = next(d for d in docs if d["kind"] == kind and field in d["spec"])
    target["spec"][wrong] = target["spec"].pop(field)
    result = kubeconform(yaml.safe_dump_all(docs), versions[-1], tmp_path)
    statuses = {(r["kind"], r["status"]) for r in result["resources"]}
    assert (kind, "statusInvalid") in statuses, result["resources"]
    assert result["returncode"] != 0


def test_wrong_types_are_caught(helm: Helm, versions: list[str], tmp_path: Path) -> None:
    m = helm.render()
    docs = m.docs
    dep = next(d for d in docs if d["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "150"
    result = kubeconform(yaml.safe_dump_all(docs), versions[0], tmp_path)
    assert ("Deployment", "statusInvalid") in {(r["kind"], r["status"])
                                               for r in result["resources"]}
