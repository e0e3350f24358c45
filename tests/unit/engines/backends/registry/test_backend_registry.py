"""The backend registry: one record per backend, reached lazily; the package's import rules."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines.assembly import EngineParams
from engines.backends.registry import BACKENDS, backend
from engines.exceptions import EngineError

ROOT = Path(__file__).resolve().parents[5]
GPU_LIBRARIES = ("torch", "tensorrt", "cuda", "onnxruntime", "diffusers", "transformers")


def test_every_backend_has_a_record_with_its_artifact_name() -> None:
    assert {name: b.artifact_name for name, b in BACKENDS.items()} == {
        "onnxruntime": "model.ort.onnx", "torch": "weights.pt", "tensorrt": "engine.plan",
        "aoti": "engine.aoti.zip"}
    assert backend("torch") is BACKENDS["torch"]
    with pytest.raises(EngineError, match="unknown backend 'tvm'"):
        backend("tvm")


def test_versions_and_fingerprints_resolve_lazily() -> None:
    import onnxruntime

    assert backend("onnxruntime").version() == onnxruntime.__version__
    cpu = backend("onnxruntime").fingerprint("cuda:0")  # onnxruntime always runs on the CPU
    assert cpu.kind == "cpu"
    assert backend("torch").fingerprint("cpu") == cpu


def test_precisions_default_and_coerce() -> None:
    assert backend("torch").precision(None) == "fp16"
    assert backend("torch").precision("fp32") == "fp32"
    assert backend("onnxruntime").precision("fp16") == "fp32"  # ORT runs fp16 models in fp32
    assert backend("onnxruntime").precision("int8") == "int8"  # opt-in, calibrated
    assert backend("tensorrt").precision("int8") == "int8"


def test_compiled_backends_add_build_flags_and_need_their_artifact() -> None:
    params = EngineParams(workspace_mb=512)
    assert {n: dict(b.key_flags(params)) for n, b in BACKENDS.items()} == {
        "onnxruntime": {}, "torch": {}, "tensorrt": {"workspace_mb": 512},
        "aoti": {"inductor": {"aot_inductor.package_constants_in_so": False,
                              "max_autotune": True}}}
    assert dict(backend("aoti").key_flags(EngineParams(device="cpu"))) == {
        "inductor": {"aot_inductor.package_constants_in_so": False}}
    assert [n for n, b in BACKENDS.items() if b.needs_artifact] == ["tensorrt", "aoti"]


def test_the_facts_models_and_tools_read_instead_of_backend_names() -> None:
    # int8 calibrated on the model's samples when no calibration set is configured: only
    # onnxruntime's (tensorrt's int8 is calibrated too, but asks for a configured set).
    assert {n: b.smoke_calibrated_precisions for n, b in BACKENDS.items()} == {
        "onnxruntime": ("int8",), "torch": (), "tensorrt": (), "aoti": ()}
    assert all(set(b.smoke_calibrated_precisions) <= set(b.precisions)
               for b in BACKENDS.values())
    # The runner drives the pixel pipeline (captured graphs on pinned rows).
    assert [n for n, b in BACKENDS.items() if b.pipelined] == ["torch"]
    # A build slow enough to look stuck says why.
    assert {n: b.build_hint for n, b in BACKENDS.items() if b.build_hint is not None} == {
        "aoti": "AOTInductor compiles each batch size: minutes per size with max-autotune on "
                "CUDA (engines.autotune)"}


def test_tensorrt_int8_keys_on_its_calibration_images(tmp_path: Path) -> None:
    """Another calibration set is another TensorRT int8 engine (it used to reuse the old one)."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, pixels in ((a, b"\x01"), (b, b"\x02")):
        folder.mkdir()
        (folder / "frame.jpg").write_bytes(b"\xff\xd8" + pixels)
    flags = {f.name: dict(backend("tensorrt").key_flags(
        EngineParams(precision="int8", calibration_dir=f))) for f in (a, b)}
    assert flags["a"]["calibration"] != flags["b"]["calibration"]
    assert flags["a"]["workspace_mb"] == flags["b"]["workspace_mb"]
    fp16 = dict(backend("tensorrt").key_flags(EngineParams(precision="fp16", calibration_dir=a)))
    assert "calibration" not in fp16  # only int8 depends on the images


def test_importing_the_engines_imports_no_gpu_library() -> None:
    modules = ["engines.backends.registry", "engines.assembly", "engines.backends.torch.runner",
               "engines.backends.torch.pipeline", "engines.backends.tensorrt.runner",
               "engines.backends.tensorrt.builder", "engines.backends.aoti.runner",
               "engines.backends.aoti.build", "engines.models.open_nsfw",
               "engines.models.minilm.engine", "engines.models.clip.engine",
               "engines.models.sd.engines"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in {GPU_LIBRARIES!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def _imports(folder: Path) -> list[tuple[Path, str]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((path, node.module))
            elif isinstance(node, ast.Import):
                found.extend((path, alias.name) for alias in node.names)
    return found


def test_backends_never_import_a_model_and_engines_never_import_the_worker() -> None:
    backends = [(p, m) for p, m in _imports(ROOT / "engines" / "backends")
                if m.startswith("engines.models")]
    worker = [(p, m) for p, m in _imports(ROOT / "engines")
              if m == "worker" or m.startswith("worker.")]
    assert backends == [] and worker == []
