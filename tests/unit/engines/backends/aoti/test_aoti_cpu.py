"""The AOTInductor backend's whole path on the CPU: compile (Inductor with the system C++
compiler), verify, time, bundle, cache, load without compiling, serve padded batches.

A tiny convolutional network keeps the compiles to seconds; open_nsfw on CUDA is in the
conformance test and the benchmarks (bench/aoti/aoti_bench.py).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines.assembly import EngineParams, EnginePlan
from engines.backends.aoti import build as aoti_build
from engines.backends.aoti.bundle import bundle_names, load_from_bundle, shape_name
from engines.backends.registry import backend
from engines.exceptions import BackendUnavailable, EngineError, InferenceFailed
from engines.loaders import OnnxModel
from engines.profiles import RangeProfile, StaticProfile
from engines.spec import EngineSpec, NativeNet, TensorSpec

torch = pytest.importorskip("torch", reason="torch is not installed (the gpu extra)")

ITEM = (8, 8, 3)


class _Tiny(torch.nn.Module):  # type: ignore[misc]
    """NHWC pixels -> two probabilities, like open_nsfw (seeded weights, so fresh() is stable)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        x = x.permute(0, 3, 1, 2).to(self.conv.weight.dtype)
        return torch.softmax(self.fc(torch.relu(self.conv(x)).mean((2, 3))), dim=1).float()


def _spec() -> EngineSpec:
    return EngineSpec("tiny", lambda: OnnxModel(b"", "0" * 64, "no onnx"),
                      (TensorSpec("x", (-1, *ITEM)),), (TensorSpec("p", (-1, 2)),),
                      native=NativeNet(lambda device: (_Tiny().to(device), "a" * 64)))


def _plan(cache: Path, sizes: tuple[int, ...] = (1, 4)) -> EnginePlan:
    return EnginePlan(_spec(), (StaticProfile("p", ITEM, sizes),),
                      EngineParams(backend="aoti", precision="fp32", device="cpu",
                                   cache_dir=cache))


def _x(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, *ITEM)).astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> EnginePlan:
    """One build for the module (two shapes: ~30 s on two cores, most of it the first)."""
    plan = _plan(tmp_path_factory.mktemp("cache"))
    plan.loader()()
    return plan


@pytest.mark.slow  # compiles
def test_the_build_records_per_shape_choice_timings_error_and_compile_time(
        built: EnginePlan) -> None:
    entry = built.cache.lookup(built.recipe())
    assert entry is not None and entry.artifact.name == "engine.aoti.zip"
    notes = entry.sidecar["build"]
    assert set(notes["serve"]) == {"b1_8x8x3", "b4_8x8x3"} == set(notes["shapes"])
    for name, shape in notes["shapes"].items():
        assert shape["serve"] == notes["serve"][name] in ("aoti", "eager")
        assert set(shape["ms"]) == {"aoti", "eager"} and all(v > 0 for v in shape["ms"].values())
        assert shape["serve"] == min(shape["ms"], key=shape["ms"].get)
        assert shape["compile_seconds"] > 0 and shape["max_error"] <= 1e-3
    assert bundle_names(entry.artifact) == {"b1_8x8x3", "b4_8x8x3"}
    # the CPU build: Inductor's defaults but for the weights, which the bundle stores once
    assert entry.sidecar["flags"] == {"inductor": {"aot_inductor.package_constants_in_so": False}}
    with zipfile.ZipFile(entry.artifact) as z:
        assert {"weights.json", "weights.bin"} <= set(z.namelist())


@pytest.mark.slow  # compiles
def test_a_cached_engine_loads_without_compiling_and_serves_padded_batches(
        built: EnginePlan, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_compile(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a cached engine must not compile")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compile)
    monkeypatch.setattr(torch, "compile", no_compile)
    ref = _Tiny().eval()
    with built.runner() as runner:
        assert runner.engine_hash == f"aoti-{built.recipe().key[:12]}"
        for n in (1, 3, 4):  # 3 runs in the batch-4 package, padded, and comes back as 3 rows
            got = runner.infer({"x": _x(n)}).result()["p"]
            want = ref(torch.from_numpy(_x(n))).detach().numpy()
            assert got.shape == (n, 2)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        with pytest.raises(InferenceFailed, match="no compiled shape holds a batch of 5"):
            runner.infer({"x": _x(5)})
        with pytest.raises(InferenceFailed, match="missing input"):
            runner.infer({"y": _x(1)})


@pytest.mark.slow  # compiles
def test_the_packages_run_on_the_bundles_weights_by_reference(built: EnginePlan) -> None:
    """The packages hold no weights: both shapes run on the one copy read from the bundle, so
    changing it changes what both answer (and the build's check passed on that copy)."""
    from engines.backends.aoti.weights import read_weights

    entry = built.cache.lookup(built.recipe())
    assert entry is not None
    weights = read_weights(entry.artifact, "cpu")
    assert set(weights) == set(_Tiny().state_dict())
    small, large = (load_from_bundle(entry.artifact, n, False, weights)
                    for n in ("b1_8x8x3", "b4_8x8x3"))
    x = torch.from_numpy(_x(4))
    want = _Tiny()(x).detach()
    torch.testing.assert_close(large(x), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(small(x[:1]), want[:1], atol=1e-5, rtol=0)
    weights["fc.weight"].zero_()  # every image now scores softmax(fc.bias)
    constant = torch.softmax(_Tiny().fc.bias.detach(), dim=0)
    for got in (large(x), small(x[:1])):
        torch.testing.assert_close(got, constant.expand_as(got), atol=1e-6, rtol=0)


@pytest.mark.slow  # compiles
def test_a_failed_activation_keeps_neither_packages_nor_weights(built: EnginePlan) -> None:
    """The batch-1 package loads (and the weights with it) before batch 4 turns out to be
    missing from the sidecar: the failure leaves nothing loaded for a retry to reuse."""
    entry = built.cache.lookup(built.recipe())
    assert entry is not None
    sidecar = json.loads((entry.path / "sidecar.json").read_text())
    del sidecar["build"]["serve"]["b4_8x8x3"]
    (entry.path / "sidecar.json").write_text(json.dumps(sidecar))
    runner: Any = built.runner()
    try:
        with pytest.raises(EngineError, match="no package for b4_8x8x3; rebuild it"):
            runner.activate()
        assert runner._weights is None and runner._net is None
    finally:
        (entry.path / "sidecar.json").write_text(json.dumps(entry.sidecar))


@pytest.mark.slow  # compiles
def test_the_runner_serves_what_the_sidecar_chose(built: EnginePlan, tmp_path: Path) -> None:
    """Edit the choice (as if the eager network had measured faster for batch 4): the runner
    then runs that shape uncompiled and still answers the same."""
    entry = built.cache.lookup(built.recipe())
    assert entry is not None
    sidecar = json.loads((entry.path / "sidecar.json").read_text())
    sidecar["build"]["serve"]["b4_8x8x3"] = "eager"
    (entry.path / "sidecar.json").write_text(json.dumps(sidecar))
    try:
        with built.runner() as runner:
            assert runner.serving == {"b1_8x8x3": sidecar["build"]["serve"]["b1_8x8x3"],
                                      "b4_8x8x3": "eager"}
            got = runner.infer({"x": _x(4)}).result()["p"]
        np.testing.assert_allclose(got, _Tiny()(torch.from_numpy(_x(4))).detach().numpy(),
                                   atol=1e-5, rtol=0)
    finally:
        (entry.path / "sidecar.json").write_text(json.dumps(entry.sidecar))


@pytest.mark.slow  # compiles
def test_a_package_off_the_float32_network_fails_the_build_and_caches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(aoti_build.TOLERANCE, "fp32", -1.0)  # any difference is too much
    plan = _plan(tmp_path, sizes=(1,))
    with pytest.raises(EngineError, match=r"b1_8x8x3: the compiled package is off from the "
                                          r"float32 network by .* \(tolerance"):
        plan.loader()()
    assert plan.cache.lookup(plan.recipe()) is None
    assert not list(tmp_path.glob("tiny/*/engine.aoti.zip"))


class _Literal(_Tiny):
    """A tensor literal in forward, larger than Inductor inlines: a constant that is neither a
    parameter nor a buffer."""

    def forward(self, x: Any) -> Any:
        shift = torch.tensor([float(i) for i in range(16)]).reshape(1, 16)[:, :2]
        return super().forward(x) + shift


@pytest.mark.slow  # compiles
def test_a_tensor_literal_in_forward_fails_the_build_with_what_to_do(tmp_path: Path) -> None:
    spec = EngineSpec("literal", lambda: OnnxModel(b"", "0" * 64, "no onnx"),
                      (TensorSpec("x", (-1, *ITEM)),), (TensorSpec("p", (-1, 2)),),
                      native=NativeNet(lambda device: (_Literal().to(device), "b" * 64)))
    plan = EnginePlan(spec, (StaticProfile("p", ITEM, (1,)),),
                      EngineParams(backend="aoti", precision="fp32", device="cpu",
                                   cache_dir=tmp_path))
    with pytest.raises(EngineError, match=r"not the network's parameters or buffers.*"
                                          r"register it as a buffer"):
        plan.loader()()
    assert plan.cache.lookup(plan.recipe()) is None


def test_refusals(tmp_path: Path) -> None:
    ranged = EnginePlan(_spec(), (RangeProfile("r", ITEM, ITEM, ITEM, 1, 2, 4),),
                        EngineParams(backend="aoti", precision="fp32", device="cpu",
                                     cache_dir=tmp_path))
    with pytest.raises(BackendUnavailable, match="static profiles only"):
        ranged.runner()
    fp16_cpu = EnginePlan(_spec(), (StaticProfile("p", ITEM, (1,)),),
                          EngineParams(backend="aoti", precision="fp16", device="cpu",
                                       cache_dir=tmp_path))
    with pytest.raises(BackendUnavailable, match="fp32 only"):
        fp16_cpu.loader()()
    assert backend("aoti").needs_artifact and backend("aoti").static_profiles


def test_bundle_names_and_a_damaged_bundle(tmp_path: Path) -> None:
    assert shape_name(8, (224, 224, 3)) == "b8_224x224x3"
    assert shape_name(2, ()) == "b2_scalar"
    bad = tmp_path / "engine.aoti.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(EngineError, match="does not read"):
        bundle_names(bad)
    with zipfile.ZipFile(bad, "w") as z:  # members outside the naming scheme are ignored
        z.writestr("../escape.pt2", b"x")
        z.writestr("b1_8.pt2", b"y" * 64)
    assert bundle_names(bad) == {"b1_8"}
    with pytest.raises(EngineError, match="b2_8 does not read"):
        load_from_bundle(bad, "b2_8", cuda=False, weights={})
    damaged = bad.read_bytes().replace(b"y" * 64, b"y" * 63 + b"z")  # its CRC no longer holds
    bad.write_bytes(damaged)
    with pytest.raises(EngineError, match="b1_8 does not read"):
        load_from_bundle(bad, "b1_8", cuda=False, weights={})


@pytest.mark.slow  # compiles
def test_packages_load_without_importing_inductor(built: EnginePlan) -> None:
    """A cached engine's start does not pay for ``torch._inductor`` (1.5 s on the H200 machine):
    a fresh process loads and runs a package with torch's C++ loader alone."""
    import subprocess
    import sys

    entry = built.cache.lookup(built.recipe())
    assert entry is not None
    code = f"""
import sys, torch
from engines.backends.aoti.bundle import load_from_bundle
from engines.backends.aoti.weights import read_weights
path = {str(entry.artifact)!r}
weights = read_weights(path, "cpu")
out = load_from_bundle(path, "b1_8x8x3", False, weights)(torch.ones(1, 8, 8, 3))
print(tuple(out.shape), "torch._inductor" in sys.modules)
"""
    root = Path(__file__).resolve().parents[5]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=root, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "(1, 2) False"


def test_quantised_outputs_may_differ_by_one_level_and_only_at_reduced_precision_widely() -> None:
    """The SD VAE's uint8 pixels: fp16 against the float32 network crossed a rounding boundary
    on more than 1% of the pixels on the H200 (never by more than one level), which failed the
    build; float32 keeps the 1% limit, and two levels fail at any precision."""
    ref = torch.zeros(1000, dtype=torch.int16)
    few, many, two = ref.clone(), ref.clone(), ref.clone()
    few[:5] = 1
    many[:100] = 1
    two[:1] = 2

    def passes(got: Any, precision: str) -> bool:
        error, tolerance = aoti_build.off_by(got, ref, "uint8", precision)
        return error <= tolerance

    assert passes(few, "fp32") and passes(few, "fp16")
    assert passes(many, "fp16") and not passes(many, "fp32")
    assert not passes(two, "fp16") and not passes(two, "fp32")


@pytest.mark.slow  # compiles
@pytest.mark.parametrize("kept", [True, False])
def test_reactivations_share_one_copy_of_the_weights_where_the_runtime_keeps_them(
        built: EnginePlan, kept: bool, keeping: Callable[[bool], None]) -> None:
    """On a torch whose runtime never releases weights bound by reference, a runner activated
    again binds the copy it had (else each activation would leave one behind); otherwise each
    activation reads its own."""
    keeping(kept)
    entry = built.cache.lookup(built.recipe())
    assert entry is not None
    sidecar = json.loads((entry.path / "sidecar.json").read_text())
    sidecar["build"]["serve"] = {n: "aoti" for n in sidecar["build"]["serve"]}  # weights read
    (entry.path / "sidecar.json").write_text(json.dumps(sidecar))
    try:
        seen = []
        for _ in range(2):
            with built.runner() as runner:
                seen.append(runner._weights)
                assert runner.infer({"x": _x(1)}).result()["p"].shape == (1, 2)
        assert seen[0] is not None and (seen[1] is seen[0]) == kept
    finally:
        (entry.path / "sidecar.json").write_text(json.dumps(entry.sidecar))


@pytest.mark.slow  # compiles
def test_a_worker_that_builds_its_engine_binds_the_copy_the_build_checked(
        tmp_path: Path, keeping: Callable[[bool], None]) -> None:
    """Where weights are kept, the build's check and the runner share one copy: the cache moves
    the artifact into place by renaming its folder, and the copy is keyed by the file."""
    from engines.backends.aoti import kept as k

    keeping(True)
    plan = _plan(tmp_path, sizes=(2,))
    entry = plan.loader()()
    (checked,) = k._kept.values()
    sidecar = json.loads((entry.path / "sidecar.json").read_text())
    sidecar["build"]["serve"] = {"b2_8x8x3": "aoti"}  # weights read, whatever was faster
    (entry.path / "sidecar.json").write_text(json.dumps(sidecar))
    with plan.runner() as runner:
        assert runner._weights is checked and len(k._kept) == 1
