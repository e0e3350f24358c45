"""The installed package's bounds: worker/ and engines/ never reach into tests/ or bench/ (the
harness the tests and benchmarks share lives in tests/harness), and the packaging config ships
neither."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("worker", "engines")
# A dotted name under tests/ or bench/, as an import or as a lazy "module:function" reference.
OUTSIDE = re.compile(r"^(tests|bench)(\.[A-Za-z_][\w.]*)?(:\w+)?$")


def _reaches_outside(path: Path) -> list[str]:
    """Each import of, or lazy reference to, a module under tests/ or bench/ in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if "." in node.value or ":" in node.value else []
        found += [f"{path}:{getattr(node, 'lineno', 0)}: {n}" for n in names if OUTSIDE.match(n)]
    return found


def test_no_shipped_module_imports_the_harness_or_bench() -> None:
    modules = [p for package in SHIPPED for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(modules) > 100  # the walk found the packages
    assert [hit for p in modules for hit in _reaches_outside(p)] == []


def test_the_check_sees_each_way_of_reaching_the_harness(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import tests.harness\nfrom tests.harness.workers import REPO\n"
                     "LAZY = 'bench.faults.kill9:main'\nfrom . import tests\n"
                     "NOTE = 'see tests/harness. Or the tests.'\nimport worker.tests_like\n")
    assert [hit.split(": ")[1] for hit in _reaches_outside(probe)] == [
        "tests.harness", "tests.harness.workers", "bench.faults.kill9:main"]


def test_the_packaging_ships_only_the_service_and_its_engines() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(where=str(ROOT), include=config["packages"]["find"]["include"])
    assert packages and {p.split(".")[0] for p in packages} == set(SHIPPED)
    assert "worker.devkit.local_kafka" in packages  # `trt-worker demo` starts it
    assert not any(p.startswith("worker.devkit.") and p != "worker.devkit.local_kafka"
                   for p in packages)
    for package, patterns in config["package-data"].items():
        for pattern in patterns:
            assert list((ROOT / package).glob(pattern)), f"{package}/{pattern} matches nothing"
