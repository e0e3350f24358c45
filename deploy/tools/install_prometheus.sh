#!/usr/bin/env bash
# Builds the pinned Prometheus server into deploy/tools/bin/prometheus for `make dashboard-check`
# (tests/integration/observe/test_dashboard_live.py: a real Prometheus scrapes a real worker and runs
# every query of the Grafana dashboard against it).
#
# Separate from deploy/tools/install.sh on purpose: Prometheus comes from the Go module proxy
# only (no GitHub releases here), and `go install` of it downloads ~1-2 GB of modules and takes
# about 5 minutes on a 2-core machine. `make deploy-check` (CI) stays fast without it.
#
# Idempotent: a binary whose stamp file names the pinned module is kept. The stamp, not
# `prometheus --version`: a `go install` build prints an empty version (the release's version
# is set by its own build with -ldflags, which go install does not run).
#
# Environment: GO (default go on PATH, else /usr/local/go/bin/go). Go's module and build caches
# are Go's defaults unless set.
set -euo pipefail

# Prometheus 3.x is published to the Go module proxy as v0.3MM.P (v0.316.0: Prometheus 3.16.0).
PROMETHEUS_MODULE="github.com/prometheus/prometheus/cmd/prometheus@v0.316.0"

TOOLS="$(cd "$(dirname "$0")" && pwd)"
BIN="$TOOLS/bin"
STAMP="$BIN/.prometheus-version"
mkdir -p "$BIN"

if [[ -n "${GO:-}" ]]; then GO_CMD="$GO"
elif command -v go >/dev/null 2>&1; then GO_CMD="go"
else GO_CMD="/usr/local/go/bin/go"; fi

log() { printf 'deploy/tools: %s\n' "$*" >&2; }

if [[ -x "$BIN/prometheus" && -f "$STAMP" && "$(cat "$STAMP")" == "$PROMETHEUS_MODULE" ]]; then
  log "prometheus ($PROMETHEUS_MODULE) present"
  exit 0
fi

log "prometheus: go install $PROMETHEUS_MODULE (Go module proxy; about 5 minutes)"
rm -f "$STAMP"
# GOFLAGS -mod=mod as in the build this was tested with (added to any GOFLAGS already set).
GOBIN="$BIN" GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" "$GO_CMD" install "$PROMETHEUS_MODULE"
printf '%s' "$PROMETHEUS_MODULE" >"$STAMP"
log "ready: $BIN/prometheus"
