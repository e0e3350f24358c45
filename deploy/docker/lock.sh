#!/usr/bin/env bash
# The images' hashed requirement locks, from constraints.txt (the versions the test suite last
# passed with) and pyproject.toml: every distribution the images install, pinned to that version
# and to the sha256 of each of its files on the index. The Dockerfiles install them with
# `pip --require-hashes --only-binary=:all:`, so a file changed on the index, or a sdist that
# would run its build code, fails the build instead of entering the image.
#
#   requirements-cpu.txt    Dockerfile.cpu: the core package
#   requirements-cuda.txt   Dockerfile.cuda: extra "gpu"
#   requirements-build.txt  both: the build backend (pyproject's [build-system] requires), for
#                           building the project's own wheel without build isolation
#
# For the images' Python (3.12) on manylinux x86_64, whatever machine runs it. `make lock` runs
# it after regenerating constraints.txt; alone: deploy/docker/lock.sh [UV] (default: uv on PATH;
# PYTHON: a Python 3.11+ for reading pyproject.toml, default python3; CONSTRAINTS: the pins,
# default constraints.txt).
set -euo pipefail

UV="${1:-uv}"
DOCKER="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$DOCKER/../.." && pwd)"
cd "$REPO"

common=(--quiet --generate-hashes --constraint "${CONSTRAINTS:-constraints.txt}"
        --python-version 3.12 --python-platform x86_64-manylinux_2_28 --only-binary :all:
        --custom-compile-command "make lock (deploy/docker/lock.sh)")

"$UV" pip compile pyproject.toml "${common[@]}" --output-file "$DOCKER/requirements-cpu.txt"
"$UV" pip compile pyproject.toml --extra gpu "${common[@]}" \
  --output-file "$DOCKER/requirements-cuda.txt"

build_in="$(mktemp)"
trap 'rm -f "$build_in"' EXIT
# tomllib: Python 3.11+, which the project requires.
"${PYTHON:-python3}" - >"$build_in" <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
EOF
# --no-annotate: the input is a temporary file, whose name would otherwise change every run.
"$UV" pip compile "$build_in" "${common[@]}" --no-annotate \
  --output-file "$DOCKER/requirements-build.txt"
