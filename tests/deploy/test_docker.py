"""The container images' Dockerfiles (deploy/docker): hadolint, and their structure: multi-stage
(the wheel built in a builder stage, installed in the runtime stage), every stage ending as a
non-root user created with a home, the engine-cache volume, the worker's env keys, entrypoint,
port and health check. The images are not built here: no Docker engine on these machines."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, REPO, missing, run, tool

DOCKER = DEPLOY / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.cuda"]
IDS = [p.name for p in DOCKERFILES]


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
        assert '"kafka-trt-worker[${EXTRAS}]"' in install
        assert re.search(r'ARG EXTRAS="gpu"', dockerfile.read_text())


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
    sources = set()
    for copy in stages[0].all("COPY"):
        words = [w for w in copy.split() if not w.startswith("--")]
        sources.update(w.removeprefix("./").rstrip("/") for w in words[:-1])
    assert sources == allowed
    for src in sources:
        assert (REPO / src).exists(), src


@pytest.mark.slow
def test_cpu_image_dependencies_are_binary_wheels_for_its_python(tmp_path: Path) -> None:
    """python:3.12-slim has no compiler: every dependency of `pip install .`, at the versions
    constraints.txt pins (as the image builds it), must resolve to a wheel for CPython 3.12 on
    manylinux x86_64 (pip's dry run, from PyPI; ~5 s)."""
    import shutil
    import sys

    # The image's build context (Dockerfile.cpu.dockerignore), copied: the build writes there.
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for name in ("worker", "engines"):
        shutil.copytree(REPO / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    platforms = [a for v in (17, 27, 28, 31, 34, 35, 36)
                 for a in ("--platform", f"manylinux_2_{v}_x86_64")]
    proc = run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-cache-dir",
                "--disable-pip-version-check", "--ignore-installed", "--python-version", "3.12",
                "--only-binary=:all:", *platforms, "--platform", "manylinux2014_x86_64",
                "--target", str(tmp_path / "t"), "--report", str(tmp_path / "r.json"),
                "-c", str(src / "constraints.txt"), str(src)],
               timeout=300)
    if proc.returncode != 0 and ("NewConnectionError" in proc.stderr
                                 or "Failed to establish" in proc.stderr):
        missing("PyPI (no network)")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    names = {i["metadata"]["name"].lower().replace("_", "-") for i in report["install"]}
    assert {"kafka-trt-worker", "onnxruntime", "confluent-kafka", "numpy"} <= names
    assert "torch" not in names  # the CPU image stays without torch
