"""Shared helpers of the deployment tests (deploy/: Helm chart, Dockerfiles, compose, dashboard).

The tools (helm, helm4, kubeconform, hadolint, shellcheck, docker compose) are looked up in
deploy/tools/bin first (``make deploy-check`` installs them there with deploy/tools/install.sh),
then on PATH. A missing tool skips its tests with the reason, unless
``DEPLOY_CHECK_REQUIRE_TOOLS=1`` (set by ``make deploy-check``, so CI never skips them): then it
fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TOOLS = DEPLOY / "tools"
TOOLS_BIN = TOOLS / "bin"
SCHEMAS = TOOLS / "schemas"
CHART = DEPLOY / "helm" / "trt-worker"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
INSTALL_HINT = "run `make deploy-check` (deploy/tools/install.sh installs it under deploy/tools)"

def _require() -> bool:
    return os.environ.get("DEPLOY_CHECK_REQUIRE_TOOLS") == "1"


def find_tool(name: str) -> str | None:
    local = TOOLS_BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def missing(what: str) -> None:
    """Skip (or, under make deploy-check, fail) the calling test: ``what`` is not available."""
    message = f"{what} is not available: {INSTALL_HINT}"
    if _require():
        pytest.fail(message + " (DEPLOY_CHECK_REQUIRE_TOOLS=1: nothing may be skipped)")
    pytest.skip(message)


def tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        missing(name)
        raise AssertionError("unreachable")
    return path


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          env=env, cwd=cwd or REPO)


# --- helm ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Helm:
    """One helm binary (helm 3 or helm 4) and the chart."""

    name: str
    path: str

    def template(self, *args: str, values: dict[str, Any] | None = None,
                 tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [self.path, "template", "t", str(CHART), *args]
        if values is not None:
            assert tmp is not None
            file = tmp / f"values-{len(list(tmp.glob('values-*.yaml')))}.yaml"
            file.write_text(yaml.safe_dump(values))
            cmd += ["-f", str(file)]
        return run(cmd)

    def render(self, *args: str, values: dict[str, Any] | None = None,
               tmp: Path | None = None) -> Manifests:
        proc = self.template(*args, values=values, tmp=tmp)
        assert proc.returncode == 0, f"{self.name} template failed:\n{proc.stderr}"
        return Manifests(proc.stdout)


class Manifests:
    """The documents of one render, by kind."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.docs: list[dict[str, Any]] = [d for d in yaml.safe_load_all(text) if d]

    def kinds(self) -> list[str]:
        return sorted(d["kind"] for d in self.docs)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}: {self.kinds()}"
        return found[0]

    def workload(self) -> dict[str, Any]:
        found = self.all("Deployment") + self.all("StatefulSet")
        assert len(found) == 1, self.kinds()
        return found[0]

    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.workload()["spec"]["template"]["spec"]
        return spec

    def container(self, name: str = "worker") -> dict[str, Any]:
        pod = self.pod()
        for c in pod["containers"] + pod.get("initContainers", []):
            if c["name"] == name:
                return dict(c)
        raise AssertionError(f"no container {name}")

    def config_toml(self) -> dict[str, Any]:
        return tomllib.loads(self.one("ConfigMap")["data"]["config.toml"])


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value, or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


HELMS = ["helm", "helm4"]


@pytest.fixture(params=HELMS)
def helm(request: pytest.FixtureRequest) -> Helm:
    """Each test runs under helm 3 and helm 4 (both are installed by deploy/tools)."""
    return Helm(request.param, tool(request.param))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No KTW_* or KAFKA_BOOTSTRAP_SERVERS from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("KTW_") or name == "KAFKA_BOOTSTRAP_SERVERS":
            monkeypatch.delenv(name)
    yield monkeypatch


def promql_parser() -> Any:
    """promql-parser (deploy/tools/python, installed by deploy/tools/install.sh), or None."""
    path = str(TOOLS / "python")
    if Path(path).is_dir() and path not in sys.path:
        sys.path.insert(0, path)
    try:
        import promql_parser  # type: ignore[import-not-found]
    except ImportError:
        return None
    return promql_parser
