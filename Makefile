# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORE := $(VENV)/.installed-core
STAMP := $(VENV)/.installed
# Everything the tests exercise on a CPU machine (torch runs on the CPU there; CUDA tests skip).
# The demo needs none of it: the core package runs open_nsfw on ONNX Runtime.
EXTRAS ?= dev,gpu,text,clip,gen,otel
# Exact versions (see its header; `make lock` regenerates it).
CONSTRAINTS ?= constraints.txt
# uv installs: its cache sits inside the venv (same filesystem) and the venv's files are hard
# links into it, so the ~6 GB torch/CUDA set is on disk once. pip kept the wheels and the
# unpacked tree side by side (9.4 GB peak for a 6.4 GB venv; a CI machine ran out of disk) and
# took 115 s where uv takes 33 s.
UV := $(BIN)/uv
export UV_CACHE_DIR ?= $(abspath $(VENV))/.uv-cache
export UV_LINK_MODE ?= hardlink

.PHONY: demo test lint unit fast integration jars clean

$(CORE): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(CONSTRAINTS) uv
	$(UV) pip install -q --python $(BIN)/python -c $(CONSTRAINTS) -e .
	touch $(CORE)

$(STAMP): $(CORE)
	$(UV) pip install -q --python $(BIN)/python -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $(STAMP)

.PHONY: lock
lock:  ## constraints.txt from a throwaway venv with every extra, at the newest allowed versions; then the images' hashed locks
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q uv
	.lock-venv/bin/uv pip install -q --python .lock-venv/bin/python -e '.[$(EXTRAS)]'
	{ sed -n '/^#/p' $(CONSTRAINTS); .lock-venv/bin/uv pip freeze --python .lock-venv/bin/python --exclude-editable; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	CONSTRAINTS=$(CONSTRAINTS) PYTHON=.lock-venv/bin/python bash deploy/docker/lock.sh .lock-venv/bin/uv
	rm -rf .lock-venv

jars: $(CORE)  ## resolve the Kafka broker jars from Maven Central (cached; not with an external cluster)
	@if [ -n "$$KAFKA_BOOTSTRAP_SERVERS" ]; then \
		echo "KAFKA_BOOTSTRAP_SERVERS is set: no local broker, no jars"; \
	else $(BIN)/python -m worker.devkit.local_kafka fetch; fi

demo: $(CORE) jars  ## local Kafka + real open_nsfw on CPU + sample images
	$(BIN)/trt-worker demo

.PHONY: demo-generation
demo-generation: $(CORE) jars  ## local Kafka + the tiny random-weights text-to-image network (CPU without a GPU) + two images
	$(UV) pip install -q --python $(BIN)/python -c $(CONSTRAINTS) -e '.[gen]'
	$(BIN)/trt-worker demo --task generation

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: $(STAMP) jars  ## unit + integration (real broker); GPU tests skip without CUDA
	$(BIN)/python -m pytest -q

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

fast: $(STAMP)  ## unit tests without the slow ones (compiles, real models): the edit-test loop
	$(BIN)/python -m pytest -q -m "not slow" tests/unit

integration: $(STAMP) jars
	$(BIN)/python -m pytest -q tests/integration

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: deploy-check
deploy-check: $(STAMP)  ## deploy/: installs pinned helm, kubeconform, hadolint, ... into deploy/tools/bin, then tests/deploy
	PYTHON=$(BIN)/python bash deploy/tools/install.sh
	DEPLOY_CHECK_REQUIRE_TOOLS=1 $(BIN)/python -m pytest -q tests/deploy

.PHONY: dashboard-check
dashboard-check: $(STAMP) jars  ## the Grafana dashboard's queries on a live run: builds pinned Prometheus (~5 min once), real worker + broker
	bash deploy/tools/install_prometheus.sh
	DASHBOARD_CHECK_REQUIRE_PROMETHEUS=1 $(BIN)/python -m pytest -q tests/integration/observe/test_dashboard_live.py
