"""deploy/tools: the installer (ShellCheck, pins, git-ignored outputs) and the schema generator
(standalone schemas whose every $ref resolves inside the file)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import REPO, SCHEMAS, TOOLS, missing, run, tool

INSTALL = TOOLS / "install.sh"
INSTALL_PROMETHEUS = TOOLS / "install_prometheus.sh"  # (make dashboard-check; not run in CI)
LOCK = TOOLS.parent / "docker" / "lock.sh"  # (make lock)


@pytest.mark.parametrize("script", [INSTALL, INSTALL_PROMETHEUS, LOCK], ids=lambda p: p.name)
def test_install_script_passes_shellcheck(script: Path) -> None:
    proc = run([tool("shellcheck"), "--severity=style", str(script)])
    assert proc.returncode == 0, proc.stdout


def test_prometheus_install_is_pinned() -> None:
    assert re.search(r'^PROMETHEUS_MODULE="[^"@]+@v\d+\.\d+\.\d+"$',
                     INSTALL_PROMETHEUS.read_text(), re.M)


def test_install_script_pins_every_tool() -> None:
    text = INSTALL.read_text()
    for spec in re.findall(r'^[A-Z0-9_]+_(?:NPM|PYPI|MODULE)="([^"]+)"', text, re.M):
        assert re.search(r"(@v?\d+\.\d+\.\d+$)|(==\d+(\.\d+)+$)", spec), spec
    assert re.search(r'^KUBECONFORM_VERSION="v\d+\.\d+\.\d+"$', text, re.M)
    for sha in re.findall(r'_SHA256="([^"]*)"', text):
        assert re.fullmatch(r"[0-9a-f]{64}", sha)


def test_installed_outputs_are_git_ignored() -> None:
    for path in ("deploy/tools/bin/helm", "deploy/tools/schemas/x.json",
                 "deploy/tools/docker/cli-plugins/docker-compose", "deploy/tools/python/x.py",
                 "deploy/tools/.cache/x"):
        proc = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert proc.returncode == 0, f"{path} is not git-ignored"
    proc = subprocess.run(["git", "check-ignore", "-q", "deploy/tools/install.sh"], cwd=REPO,
                          check=False)
    assert proc.returncode == 1


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + \
            [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_generated_schemas_are_standalone() -> None:
    files = sorted(SCHEMAS.glob("v*-standalone-strict/*.json"))
    if not files:
        missing(f"the kubeconform schemas ({SCHEMAS})")
    for file in files:
        schema = json.loads(file.read_text())
        for ref in _refs(schema):
            assert ref.startswith("#/$defs/"), (file.name, ref)
            assert ref.removeprefix("#/$defs/") in schema["$defs"], (file.name, ref)
        assert schema["additionalProperties"] is False  # the -strict flavour
    crds = sorted((SCHEMAS / "crds").glob("*/*.json"))
    assert {f"{p.parent.name}/{p.name}" for p in crds} >= {
        "keda.sh/scaledobject_v1alpha1.json", "monitoring.coreos.com/podmonitor_v1.json"}


def test_gen_schemas_crd_conversion(tmp_path: Path) -> None:
    """The CRD conversion (kubeconform's openapi2jsonschema rules) on a small CRD."""
    import sys

    sys.path.insert(0, str(TOOLS))
    try:
        import gen_schemas  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TOOLS))
    crd = tmp_path / "crd.yaml"
    crd.write_text("""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
spec:
  group: example.com
  names: {kind: Widget}
  versions:
    - name: v1
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {x-kubernetes-int-or-string: true}
                free: {type: object, x-kubernetes-preserve-unknown-fields: true,
                       properties: {a: {type: string}}}
""")
    (path,) = gen_schemas.write_crds([crd], tmp_path / "out")
    assert path == tmp_path / "out" / "crds" / "example.com" / "widget_v1.json"
    schema = json.loads(path.read_text())
    assert "additionalProperties" not in schema  # the root stays open (apiVersion, kind, ...)
    spec = schema["properties"]["spec"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["size"] == {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    assert "additionalProperties" not in spec["properties"]["free"]


@pytest.mark.parametrize("target", ["deploy-check"])
def test_make_target(target: str) -> None:
    proc = run(["make", "-n", target])
    assert proc.returncode == 0, proc.stderr
    assert "deploy/tools/install.sh" in proc.stdout
    assert "pytest -q tests/deploy" in proc.stdout
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert ci.index("make deploy-check") > ci.index("make lint")
