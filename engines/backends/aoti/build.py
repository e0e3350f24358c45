"""Build the AOTInductor artifact: export, compile, verify, time, choose, bundle.

Per static shape of the plan's profiles:

1. ``torch.export`` the network (engine precision, channels-last where the model says so) on
   sample inputs of that shape, and compile it with ``aoti_compile_and_package`` (max-autotune
   on CUDA: minutes per shape, which is why it happens once, here, and never at start-up);
2. write the bundle (the packages hold no weights; the bundle stores them once,
   :mod:`.weights`), load each package from it as the runner will, and check it against the
   float32 network (IEEE fp32: TF32 off) on the same inputs; a package outside the tolerance
   fails the build (nothing is cached);
3. time what could serve the shape: the package called directly, a CUDA graph over it, and
   today's eager network under a CUDA graph (on the CPU: the package vs the eager network),
   and choose the fastest.

The choice, the timings, the error against the reference and the compile time per shape are
returned as the cache sidecar's ``build`` notes; the runner serves what was chosen.
"""

from __future__ import annotations

import copy
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.aoti.bundle import load_from_bundle, shape_name, write_bundle
from engines.backends.aoti.kept import shared_weights
from engines.backends.aoti.options import inductor_options
from engines.backends.torch.artifact import in_engine_form, native_net
from engines.backends.torch.graphs import capture, sample_input
from engines.backends.torch.runner import GraphKey, graph_shapes
from engines.cache import BuildNotes, BuildRecipe
from engines.exceptions import BackendUnavailable, EngineError
from engines.profiles import StaticProfile

if TYPE_CHECKING:
    from engines.assembly import EnginePlan

log = logging.getLogger("engines")

# Largest difference from the float32 network, relative to the reference's largest magnitude
# (at least 1): fp16 rounds inputs and weights (open_nsfw's probabilities: ~5e-3 on an H200).
TOLERANCE = {"fp32": 1e-3, "fp16": 2e-2}
VARIANTS_CUDA = ("aoti", "aoti_graph", "eager_graph")
VARIANTS_CPU = ("aoti", "eager")


def static_keys(plan: EnginePlan) -> list[GraphKey]:
    keys: set[GraphKey] = set()
    for p in plan.profiles:
        if not isinstance(p, StaticProfile):
            raise BackendUnavailable(f"the aoti backend compiles static profiles only; "
                                     f"{p.name!r} is a range")
        keys.update((b, p.item_shape) for b in p.batch_sizes)
    if not keys:
        raise BackendUnavailable("the aoti backend needs at least one static profile")
    return sorted(keys)


def sample_args(plan: EnginePlan, key: GraphKey, device: str) -> tuple[Any, ...]:
    """The inputs one static shape is exported, checked and timed on, on ``device``."""
    import torch

    return tuple(torch.from_numpy(sample_input(t.dtype, s)).to(device)
                 for t, s in zip(plan.spec.inputs, graph_shapes(plan.spec, key), strict=True))


def build_aoti_engine(plan: EnginePlan, recipe: BuildRecipe, out: Path) -> BuildNotes:
    """The registry's builder."""
    import torch

    p = plan.params
    device = p.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise BackendUnavailable("the aoti backend builds for CUDA here and none is available")
    if not cuda and p.precision != "fp32":
        raise BackendUnavailable("the aoti backend on CPU builds fp32 only")
    net, reference = engine_and_reference(plan)
    keys = static_keys(plan)
    shapes: dict[str, Any] = {}
    with _ieee_fp32(cuda):
        with tempfile.TemporaryDirectory(prefix="aoti-", dir=out.parent) as tmp:
            packages: dict[str, Path] = {}
            constants: dict[str, Any] = {}
            for key in keys:
                name = shape_name(*key)
                packages[name] = Path(tmp) / f"{name}.pt2"
                shapes[name] = {"compile_seconds": _compile_shape(plan, key, net,
                                                                  packages[name], constants)}
            write_bundle(out, packages, constants)
            del constants  # what is checked and timed below is what the runner will load
        weights = shared_weights(out, device)  # what the runner will bind, where kept
        for key in keys:
            shapes[shape_name(*key)].update(_check_shape(plan, key, net, reference, out,
                                                         weights))
    return {"serve": {n: s["serve"] for n, s in shapes.items()}, "shapes": shapes,
            "inductor": inductor_options(device, p.autotune), "torch": str(torch.__version__)}


def engine_and_reference(plan: EnginePlan) -> tuple[Any, Any]:
    """(the network in the engine's form: precision and layout, what is exported; the same
    weights in float32, what every package is checked against), both on the plan's device."""
    import torch

    device = plan.params.device
    native = native_net(plan.spec)
    module, _ = native.fresh(device if native.build_on_target else "cpu")
    reference = module.to(device=device, dtype=torch.float32).eval()
    net = in_engine_form(copy.deepcopy(reference), native, device, plan.params.precision)
    return net, reference


def _compile_shape(plan: EnginePlan, key: GraphKey, net: Any, path: Path,
                   constants: dict[str, Any]) -> float:
    """Export and compile one shape's package to ``path`` (weights left out of it, added to
    ``constants``: every shape exports the same ones); its compile seconds."""
    import torch

    args = sample_args(plan, key, plan.params.device)
    name = shape_name(*key)
    log.info("aoti_compile_started: %s %s (max-autotune on CUDA takes minutes)",
             plan.spec.model_id, name)
    started = time.monotonic()
    try:
        with torch.no_grad():
            exported = torch.export.export(net, args)
        options = inductor_options(plan.params.device, plan.params.autotune)
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path),
                                                 inductor_configs=options)
    except Exception as exc:  # export and Inductor raise many types; each fails the build
        raise EngineError(f"{plan.spec.model_id} {name}: AOTInductor compile failed: "
                          f"{type(exc).__name__}: {exc}") from exc
    constants.update((k, v) for k, v in {**exported.state_dict, **exported.constants}.items()
                     if isinstance(v, torch.Tensor))
    return round(time.monotonic() - started, 1)


def _check_shape(plan: EnginePlan, key: GraphKey, net: Any, reference: Any, bundle: Path,
                 weights: dict[str, Any]) -> dict[str, Any]:
    """Load one shape's package from the written bundle as the runner does, check it against
    the float32 network and time the ways to serve it."""
    import torch

    device = plan.params.device
    cuda = device.startswith("cuda")
    args = sample_args(plan, key, device)
    name = shape_name(*key)
    model = load_from_bundle(bundle, name, cuda, weights)
    with torch.no_grad():
        got, ref = model(*args).double(), reference(*args).double()
    error, tolerance = off_by(got, ref, plan.spec.outputs[0].dtype, plan.params.precision)
    if not error <= tolerance:  # NaN fails too
        raise EngineError(f"{plan.spec.model_id} {name}: the compiled package is off from the "
                          f"float32 network by {error:.2e} (tolerance {tolerance:.0e})")
    timings = time_variants(model, net, args, cuda)
    measured = {v: ms for v, ms in timings.items() if ms is not None}  # "aoti" always is
    serve = min(measured, key=measured.__getitem__)
    log.info("aoti_compiled: %s %s, error %.1e, serving %s (%s)", plan.spec.model_id, name,
             error, serve, timings)
    return {"serve": serve, "max_error": error, "ms": timings}


def off_by(got: Any, ref: Any, dtype: str, precision: str) -> tuple[float, float]:
    """(error, tolerance). Float outputs: the largest difference relative to the reference's
    largest magnitude (at least 1). Quantised outputs (the VAE's uint8 pixels): the largest
    difference in levels, within one level. At float32 at most 1% of the values may differ (a
    rounding boundary crossed; the torch and ONNX Runtime engines differ the same way); at a
    reduced precision any number may (the SD 1.5 VAE in fp16 on the H200 crossed more than 1%
    of them, never by more than one level)."""
    if np.issubdtype(np.dtype(dtype), np.integer):
        diff = (got - ref).abs()
        few = float((diff > 0).double().mean()) <= 0.01
        return float(diff.max()), (1.0 if few or precision != "fp32" else 0.0)
    return float((got - ref).abs().max() / max(1.0, float(ref.abs().max()))), TOLERANCE[precision]


def time_variants(model: Any, net: Any, args: tuple[Any, ...], cuda: bool
                  ) -> dict[str, float | None]:
    """Median milliseconds per call of each way to serve a shape (None: it cannot, e.g. a
    capture that fails)."""
    import torch

    if not cuda:
        return {"aoti": _median_ms(lambda: model(*args), sync=None),
                "eager": _median_ms(lambda: net(*args), sync=None)}
    sync = torch.cuda.synchronize
    out: dict[str, float | None] = {"aoti": _median_ms(lambda: model(*args), sync)}
    for variant, fn in (("aoti_graph", model), ("eager_graph", net)):
        try:
            graph, _ = capture(fn, list(args))
        except RuntimeError as exc:
            log.warning("aoti_variant_unavailable: %s: %s", variant, exc)
            out[variant] = None
            continue
        out[variant] = _median_ms(graph.replay, sync)
        del graph
    return out


def _median_ms(call: Callable[[], Any], sync: Callable[[], None] | None, *, rounds: int = 7,
               per_round: int = 10) -> float:
    """Back-to-back calls (the device pipelines them, as in serving), synchronised per round."""
    import torch

    samples = []
    with torch.no_grad():
        for i in range(rounds + 1):
            started = time.perf_counter()
            for _ in range(per_round):
                call()
            if sync is not None:
                sync()
            if i:  # the first round warms up (kernel selection, lazy allocations)
                samples.append((time.perf_counter() - started) * 1000 / per_round)
    return round(statistics.median(samples), 4)


@contextmanager
def _ieee_fp32(cuda: bool) -> Iterator[None]:
    """fp32 means IEEE fp32 while building (TF32 off), as in the torch runner; restored after."""
    if not cuda:
        yield
        return
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
