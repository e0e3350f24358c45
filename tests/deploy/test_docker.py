"""The container images' Dockerfiles (deploy/docker): hadolint, and their structure: multi-stage
(the wheel built in a builder stage, installed in the runtime stage), every stage ending as a
non-root user created with a home, the engine-cache volume, the worker's env keys, entrypoint,
port and health check; every dependency installed from a hashed lock (deploy/docker/lock.sh,
run by `make lock`) with --require-hashes. The images are not built here: no Docker engine on
these machines."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, REPO, missing, run, tool

DOCKER = DEPLOY / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.cuda"]
IDS = [p.name for p in DOCKERFILES]
# Each image's hashed lock: (its file, the project's extras it covers).
LOCKS = {"Dockerfile.cpu": ("requirements-cpu.txt", ()),
         "Dockerfile.cuda": ("requirements-cuda.txt", ("gpu",))}
BUILD_LOCK = "requirements-build.txt"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]

    def last(self, op: str) -> str | None:
        found = self.all(op)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for arg in self.all("ENV"):
            for token in shlex.split(arg):
                key, _, value = token.partition("=")
                out[key] = value
        return out


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, instructions with continuations joined."""
    lines, buf = [], ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        if buf.strip():
            lines.append(buf.strip())
        buf = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif stages:
            stages[-1].instructions.append((op, rest.strip()))
        elif op == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value.strip('"')
    return args, stages


def resolve(base: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_hadolint(dockerfile: Path) -> None:
    proc = run([tool("hadolint"), "--config", str(DOCKER / ".hadolint.yaml"), "--no-color",
                str(dockerfile)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_the_old_dockerfile_is_gone() -> None:
    assert not (DEPLOY / "Dockerfile").exists()


def test_hadolint_finds_faults(tmp_path: Path) -> None:
    """The linter is live: a Dockerfile that ends as root with an unpinned apt install fails."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.12-slim\nRUN apt-get update && apt-get install -y curl\n"
                   "USER root\n")
    proc = run([tool("hadolint"), "--config", str(DOCKER / ".hadolint.yaml"), "--no-color",
                str(bad)])
    assert proc.returncode != 0
    for rule in ("DL3002", "DL3008", "DL3009", "DL3015"):
        assert rule in proc.stdout, (rule, proc.stdout)


def check_users(dockerfile: Path) -> None:
    _, stages = parse(dockerfile)
    assert len(stages) >= 2, "multi-stage: a builder and a runtime stage"
    for stage in stages:
        user = stage.last("USER")
        assert user is not None, f"stage {stage.name} runs as root (no USER)"
        uid = user.split(":")[0]
        assert uid not in {"root", "0"}, f"stage {stage.name}: USER {user}"
        # The USER is the last word on who runs: nothing after it switches back.
        ops = [op for op, _ in stage.instructions]
        assert ops.index("USER") == len(ops) - 1 - ops[::-1].index("USER")
        runs = " ".join(stage.all("RUN"))
        add = re.search(rf"useradd\b[^&;]*--uid {uid}\b[^&;]*", runs)
        assert add, f"stage {stage.name}: no useradd for uid {uid}"
        assert "--create-home" in add.group(0) or re.search(r"\s-m\b", add.group(0))
        home = re.search(r"--home-dir (\S+)", add.group(0))
        assert home, f"stage {stage.name}: the user has no explicit home"
        if stage is stages[-1]:
            assert stage.env()["HOME"] == home.group(1)
            assert stage.last("WORKDIR") == home.group(1)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_every_stage_runs_as_a_non_root_user_with_a_home(dockerfile: Path) -> None:
    check_users(dockerfile)


@pytest.mark.parametrize(("old", "new"), [
    ("USER 10001:10001\nWORKDIR /home/worker", "USER root\nWORKDIR /home/worker"),
    ("--create-home --home-dir /home/builder", "--no-create-home"),
    ("USER 10001:10001\nWORKDIR /home/builder/src", "WORKDIR /home/builder/src"),
])
def test_the_user_check_catches(tmp_path: Path, old: str, new: str) -> None:
    text = (DOCKER / "Dockerfile.cpu").read_text()
    assert old in text
    bad = tmp_path / "Dockerfile"
    bad.write_text(text.replace(old, new))
    with pytest.raises(AssertionError):
        check_users(bad)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_runtime_stage(dockerfile: Path) -> None:
    args, stages = parse(dockerfile)
    builder, runtime = stages[0], stages[-1]
    assert builder.name == "builder"
    # The wheel is built in the builder and installed, from there only, in the runtime.
    assert "pip wheel" in " ".join(builder.all("RUN"))
    install = " ".join(runtime.all("RUN"))
    assert "--mount=type=bind,from=builder" in install
    assert "--no-index" in install and "pip install" in install
    assert "pip wheel" not in install
    assert "trt-worker --help" in install
    assert not [c for c in runtime.all("COPY") if "--from=builder" not in c], \
        "the runtime stage copies nothing from the build context"

    env = runtime.env()
    cache = env["KTW_ENGINES__CACHE_DIR"]
    volumes = [v for arg in runtime.all("VOLUME") for v in json.loads(arg)]
    assert any(cache == v or cache.startswith(v.rstrip("/") + "/") for v in volumes), \
        f"the engine cache {cache} is not on a VOLUME ({volumes})"
    assert env["KTW_CACHE_DIR"] in volumes
    assert "chown" in install or "chown" in " ".join(runtime.all("RUN"))
    assert env["KTW_METRICS__PORT"] == "9464"
    assert runtime.all("EXPOSE") == ["9464"]
    assert json.loads(runtime.last("ENTRYPOINT") or "null") == ["trt-worker"]
    assert json.loads(runtime.last("CMD") or "null") == ["run"]
    health = runtime.last("HEALTHCHECK") or ""
    assert "/healthz" in health and "127.0.0.1" in health and "KTW_METRICS__PORT" in health

    base = resolve(runtime.base, args)
    if dockerfile.name == "Dockerfile.cpu":
        assert base.startswith("python:3.12-slim")
        assert resolve(builder.base, args) == base
    else:
        assert re.fullmatch(r"nvidia/cuda:[\d.]+-(cudnn-)?runtime-ubuntu[\d.]+", base), base


def pip_commands(stage: Stage) -> list[list[str]]:
    """Every pip invocation of a stage's RUNs, as words (``pip`` or a path ending in /pip)."""
    found = []
    for run_ in stage.all("RUN"):
        for part in re.split(r"&&|;", run_):
            words = shlex.split(part.replace("\\\n", " "))
            for i, word in enumerate(words):
                if word == "pip" or word.endswith("/pip"):
                    found.append(words[i:])
                    break
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_every_dependency_comes_from_a_hashed_lock(dockerfile: Path) -> None:
    """Each pip command that fetches or installs dependencies does it from a lock, with
    --require-hashes and wheels only; the project's own wheel goes in without dependencies and
    is built with the locked backend (no build isolation, which would fetch an unhashed one)."""
    lock, _ = LOCKS[dockerfile.name]
    _, stages = parse(dockerfile)
    builder, runtime = stages[0], stages[-1]
    copied = " ".join(builder.all("COPY"))
    assert f"deploy/docker/{lock}" in copied and f"deploy/docker/{BUILD_LOCK}" in copied
    assert not [i for s in stages for i in s.instructions if "constraints.txt" in i[1]]

    commands = pip_commands(builder) + pip_commands(runtime)
    assert commands
    requirement_files = set()
    for cmd in commands:
        verb = cmd[1]
        if verb == "wheel" or (verb == "install" and "-r" not in cmd):
            # Only the project's own wheel, never its dependencies.
            assert "--no-deps" in cmd, cmd
            if verb == "wheel":
                assert "--no-build-isolation" in cmd and cmd[-1] == ".", cmd
            continue
        if verb == "check":
            continue
        assert verb in ("install", "download"), cmd
        assert "--require-hashes" in cmd and "--only-binary=:all:" in cmd, cmd
        requirement_files.add(Path(cmd[cmd.index("-r") + 1]).name)
    assert {lock, BUILD_LOCK, "requirements.txt"} == requirement_files
    # The runtime installs from the lock the builder passed along, then checks the result.
    runtime_cmds = [" ".join(c) for c in pip_commands(runtime)]
    assert any("--require-hashes" in c and "--no-index" in c for c in runtime_cmds)
    assert "pip check" in runtime_cmds
    assert f"cp {lock} /home/builder/wheels/requirements.txt" in " ".join(builder.all("RUN"))


def lock_pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a hashed requirements file."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+?)(?:\s*;[^-]*)?"
                         r"((?:\s+--hash=sha256:[0-9a-f]{64})*)", line)
        assert m, f"{path.name}: not an exact pin with hashes: {line}"
        pins[canonical(m.group(1))] = (m.group(2), re.findall(r"[0-9a-f]{64}", m.group(3)))
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(specs: list[str]) -> set[str]:
    return {canonical(re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0]) for s in specs}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_locks_are_hashed_and_follow_constraints(dockerfile: Path) -> None:
    """Every line of the lock is name==version with at least one sha256; the versions are
    constraints.txt's where it pins the package; the lock covers the project's dependencies
    (with the image's extras) and the build backend's lock covers [build-system] requires."""
    import tomllib

    lock, extras = LOCKS[dockerfile.name]
    pins = lock_pins(DOCKER / lock)
    assert pins
    for name, (version, hashes) in pins.items():
        assert hashes, f"{lock}: {name}=={version} has no hash"
    constraints = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            constraints[canonical(name)] = version.strip()
    for name, (version, _) in pins.items():
        if name in constraints:
            assert version == constraints[name], (lock, name, version, constraints[name])

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    specs = list(project["project"]["dependencies"])
    for extra in extras:
        specs += project["project"]["optional-dependencies"][extra]
    missing_ = requirement_names(specs) - set(pins)
    assert not missing_, f"{lock} lacks {sorted(missing_)}: run `make lock`"
    build = lock_pins(DOCKER / BUILD_LOCK)
    assert requirement_names(project["build-system"]["requires"]) <= set(build)
    assert all(hashes for _, hashes in build.values())


def test_make_lock_writes_the_image_locks() -> None:
    """`make lock` runs deploy/docker/lock.sh after constraints.txt, which compiles each lock with
    hashes, from constraints.txt, for the images' Python."""
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile.split("\nlock:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()[1:]]
    script = [i for i, line in enumerate(lines) if "deploy/docker/lock.sh" in line]
    moved = [i for i, line in enumerate(lines) if line.startswith("mv $(CONSTRAINTS).new")]
    assert script and moved and script[0] > moved[0], lines
    text = (DOCKER / "lock.sh").read_text()
    assert "--generate-hashes" in text and "--python-version 3.12" in text
    assert "--only-binary :all:" in text
    for name in [lock for lock, _ in LOCKS.values()] + [BUILD_LOCK]:
        assert f"$DOCKER/{name}" in text, name


@pytest.mark.slow
def test_lock_script_reproduces_the_committed_locks(tmp_path: Path) -> None:
    """deploy/docker/lock.sh on the committed pyproject.toml and constraints.txt writes the
    committed locks (uv, from PyPI; ~30 s): they are in step with constraints.txt."""
    import shutil
    import sys

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        missing("uv")
    (tmp_path / "deploy" / "docker").mkdir(parents=True)
    shutil.copy(DOCKER / "lock.sh", tmp_path / "deploy" / "docker" / "lock.sh")
    for name in ("pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    # The caller's environment (index and certificate settings), with a cache of its own.
    env = {**os.environ, "PYTHON": sys.executable, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    env.pop("CONSTRAINTS", None)
    proc = run(["bash", str(tmp_path / "deploy" / "docker" / "lock.sh"), str(uv)], env=env,
               timeout=300)
    if proc.returncode != 0 and re.search(r"dns error|Network is unreachable|timed out",
                                          proc.stderr):
        missing("PyPI (no network)")
    assert proc.returncode == 0, proc.stderr
    for name in [lock for lock, _ in LOCKS.values()] + [BUILD_LOCK]:
        assert (tmp_path / "deploy" / "docker" / name).read_text() == \
            (DOCKER / name).read_text(), f"{name} is out of step: run `make lock`"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_env_keys_are_the_workers(dockerfile: Path, clean_env: pytest.MonkeyPatch) -> None:
    """The KTW_* settings the image sets are keys the worker reads, with the meaning intended."""
    from worker.config import load_config

    env = parse(dockerfile)[1][-1].env()
    for key, value in env.items():
        if key.startswith("KTW_"):
            clean_env.setenv(key, value)
    cfg = load_config()
    assert str(cfg.engines.cache_dir) == env["KTW_ENGINES__CACHE_DIR"]
    assert cfg.metrics.port == int(env["KTW_METRICS__PORT"])
    assert cfg.log.format == env["KTW_LOG__FORMAT"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_build_context_keeps_what_the_build_copies(dockerfile: Path) -> None:
    """<Dockerfile>.dockerignore (BuildKit) allows exactly the sources the builder copies."""
    ignore = Path(f"{dockerfile}.dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in ignore if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    _, stages = parse(dockerfile)
    sources: set[str] = set()
    for copy in stages[0].all("COPY"):
        words = [w for w in copy.split() if not w.startswith("--")]
        sources.update(w.removeprefix("./").rstrip("/") for w in words[:-1])
    assert sources == allowed
    for src in sources:
        assert (REPO / src).exists(), src


@pytest.mark.slow
def test_cpu_image_dependencies_are_binary_wheels_for_its_python(tmp_path: Path) -> None:
    """python:3.12-slim has no compiler: every dependency in the CPU image's lock must resolve,
    hash-checked, to a wheel for CPython 3.12 on manylinux x86_64 (pip's dry run, from PyPI;
    ~5 s)."""
    import sys

    platforms = [a for v in (17, 27, 28, 31, 34, 35, 36)
                 for a in ("--platform", f"manylinux_2_{v}_x86_64")]
    proc = run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-cache-dir",
                "--disable-pip-version-check", "--ignore-installed", "--python-version", "3.12",
                "--only-binary=:all:", *platforms, "--platform", "manylinux2014_x86_64",
                "--target", str(tmp_path / "t"), "--report", str(tmp_path / "r.json"),
                "--require-hashes", "-r", str(DOCKER / "requirements-cpu.txt")],
               timeout=300)
    if proc.returncode != 0 and ("NewConnectionError" in proc.stderr
                                 or "Failed to establish" in proc.stderr):
        missing("PyPI (no network)")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    names = {i["metadata"]["name"].lower().replace("_", "-") for i in report["install"]}
    assert {"onnxruntime", "confluent-kafka", "numpy"} <= names
    assert "torch" not in names  # the CPU image stays without torch
