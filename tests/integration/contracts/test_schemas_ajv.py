"""The schema files under a second, strict validator: ajv (Node), the one many consumers use.

Every schema compiles with ``new Ajv2020({strict: true})``, which refuses unknown keywords (the
v1 files' ``x-msgpack-type``), keywords whose type the schema does not state, loose tuples and
required names defined nowhere; every JSON example validates. ajv and ajv-formats are installed
with npm into the pytest cache on first use (no broker needed). Skipped only without node and
npm, or when npm cannot reach its registry and nothing is cached yet.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.contract import Contract

AJV = "ajv@8.17.1"
AJV_FORMATS = "ajv-formats@3.0.1"
SCRIPT = Path(__file__).with_name("ajv_check.js")
EXAMPLES = sorted((Contract().root / "examples").glob("*.json"))
# npm's words for a registry it cannot reach (no network, DNS, proxy, TLS interception).
UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT",
               "ENETUNREACH", "EHOSTUNREACH", "network", "proxy", "SELF_SIGNED_CERT",
               "UNABLE_TO_GET_ISSUER_CERT")
BAD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"id": {"type": "string", "x-msgpack-type": "str"}},
}


def _installed(root: Path) -> bool:
    return all((root / "node_modules" / name / "package.json").is_file()
               for name in ("ajv", "ajv-formats"))


@pytest.fixture(scope="session")
def ajv_modules(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder whose node_modules holds ajv and ajv-formats: pytest's cache, per version, or a
    temporary folder when the cache plugin is off (``-p no:cacheprovider``)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("needs node and npm: ajv is a Node library")
    name = f"{AJV}+{AJV_FORMATS}".replace("@", "-")
    cache = getattr(request.config, "cache", None)
    root: Path = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
    if _installed(root):
        return root
    try:
        run = subprocess.run(["npm", "install", "--prefix", str(root), "--no-audit", "--no-fund",
                              "--loglevel=error", AJV, AJV_FORMATS],
                             capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {AJV} timed out after 300 s: registry unreachable?")
    if run.returncode != 0:
        why = [line for line in run.stderr.splitlines() if any(w in line for w in UNREACHABLE)]
        if why:
            pytest.skip(f"npm cannot reach its registry to install {AJV}: {why[0].strip()}")
        pytest.fail(f"npm install {AJV} {AJV_FORMATS} failed:\n{run.stderr[-3000:]}")
    assert _installed(root), run.stdout[-2000:]
    return root


@pytest.fixture(scope="session")
def report(ajv_modules: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ajv run: every schema file and a bad one compiled, every example and two invalid
    documents validated."""
    contract = Contract()
    tmp = tmp_path_factory.mktemp("ajv")
    bad_schema = tmp / "bad.schema.json"
    bad_schema.write_text(json.dumps(BAD_SCHEMA))
    v1_as_v2 = tmp / "v1-result.json"  # a copy: the report is keyed by file
    v1_as_v2.write_text((contract.root / "examples" / "moderation-result.ok.json").read_text())
    ok_without_rule = tmp / "ok-without-rule.json"
    doc = json.loads((contract.root / "examples" / "moderation-result.v2.ok.json").read_text())
    ok_without_rule.write_text(json.dumps({**doc, "rule": "none"}))
    spec = {
        "schemas": {**{n: str(p) for n, p in contract.paths.items()}, "bad": str(bad_schema)},
        "documents": [[contract.name_for_example(p), str(p)] for p in EXAMPLES] + [
            ["moderation-result.v2", str(v1_as_v2)],
            ["moderation-result.v2", str(ok_without_rule)]],
    }
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    run = subprocess.run(["node", str(SCRIPT), str(ajv_modules), str(spec_path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out: dict[str, Any] = json.loads(run.stdout)
    out["negative"] = [str(v1_as_v2), str(ok_without_rule)]
    return out


def test_every_schema_compiles_in_ajv_strict_mode(report: dict[str, Any]) -> None:
    compiled = {n: e for n, e in report["compiled"].items() if n != "bad"}
    assert set(compiled) == set(Contract().names)
    assert compiled == dict.fromkeys(compiled)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_validates_in_ajv(report: dict[str, Any], path: Path) -> None:
    assert report["validated"][str(path)] is None


def test_ajv_strict_mode_refuses_a_custom_keyword(report: dict[str, Any]) -> None:
    """The check above can fail: what the v1 files had is refused."""
    assert "unknown keyword" in report["compiled"]["bad"]
    assert "x-msgpack-type" in report["compiled"]["bad"]


def test_ajv_refuses_documents_the_schema_refuses(report: dict[str, Any]) -> None:
    """A v1 result is no v2 one, and a v2 ok result must name its rule."""
    v1_as_v2, ok_without_rule = report["negative"]
    assert report["validated"][v1_as_v2]
    assert report["validated"][ok_without_rule]
