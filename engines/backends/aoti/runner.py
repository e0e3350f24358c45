"""Serve an AOTInductor artifact: each static shape as its build chose, nothing compiled.

The runner is the torch runner (its graph slots, eager path, CPU executor and in-flight rules)
with a different network: a dispatcher that calls the package compiled for the batch's exact
shape, or the eager network where the build measured that faster. A batch is padded up to the
smallest compiled batch size that holds it (a package runs only the shape it was compiled for).
Packages are loaded with ``run_single_threaded`` so a CUDA graph can be captured over them;
the runner's lock keeps calls single-threaded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.backends.aoti.build import static_keys
from engines.backends.aoti.bundle import bundle_names, load_from_bundle, shape_name
from engines.backends.aoti.kept import shared_weights
from engines.backends.base import InferHandle, Outputs
from engines.backends.torch.artifact import in_engine_form, native_net
from engines.backends.torch.runner import GraphKey, TorchRunner, compile_log
from engines.exceptions import BackendUnavailable, EngineError, InferenceFailed

if TYPE_CHECKING:
    from engines.assembly import DeferredLoader, EnginePlan


def make_aoti_runner(plan: EnginePlan, engine: DeferredLoader | None) -> AotiRunner:
    """The registry's runner factory (the backend needs its artifact: ``engine`` is set)."""
    if engine is None:
        raise BackendUnavailable("the aoti backend runs only a built artifact")
    p = plan.params
    return AotiRunner(plan, engine, device=p.device, slots=p.slots, cuda_graphs=p.cuda_graphs)


class ShapeDispatch:
    """The network as the runner calls it: by the inputs' exact shape."""

    def __init__(self, nets: Mapping[GraphKey, Any]) -> None:
        self.nets = dict(nets)

    def __call__(self, *inputs: Any) -> Any:
        first = inputs[0]
        try:
            net = self.nets[(int(first.shape[0]), tuple(int(d) for d in first.shape[1:]))]
        except KeyError:
            raise InferenceFailed(f"no compiled package for input shape {tuple(first.shape)}; "
                                  f"compiled: {sorted(self.nets)}") from None
        return net(*inputs)


class _Rows:
    """The first ``n`` rows of a padded batch's outputs."""

    __slots__ = ("_handle", "_n")

    def __init__(self, handle: InferHandle, n: int) -> None:
        self._handle, self._n = handle, n

    def done(self) -> bool:
        return self._handle.done()

    def result(self, timeout: float | None = None) -> Outputs:
        return {k: v[: self._n] for k, v in self._handle.result(timeout).items()}


class AotiRunner(TorchRunner):
    backend = "aoti"

    def __init__(self, plan: EnginePlan, engine: DeferredLoader, *, device: str = "cuda:0",
                 slots: int = 2, cuda_graphs: bool = True) -> None:
        super().__init__(plan.spec, profiles=plan.profiles, precision=plan.params.precision,
                         engine=engine, device=device, slots=slots, cuda_graphs=cuda_graphs)
        self._keys = static_keys(plan)
        self.serving: dict[str, str] = {}  # shape name -> what serves it (from the sidecar)
        self._eager_module: Any = None
        self._weights: dict[str, Any] | None = None  # the packages point into these

    def _activate(self) -> None:
        t0 = time.monotonic()
        self._torch_for_device()
        assert self._engine is not None
        t1 = time.monotonic()
        entry = self._engine()
        t2 = time.monotonic()
        serve = dict(entry.sidecar.get("build", {}).get("serve", {}))
        packages = bundle_names(entry.artifact)
        nets: dict[GraphKey, Any] = {}
        for key in self._keys:
            name = shape_name(*key)
            if name not in packages or name not in serve:
                raise EngineError(f"engine {entry.key}: no package for {name}; rebuild it")
            self.serving[name] = serve[name]
            if serve[name].startswith("eager"):
                nets[key] = self._eager_net()
                continue
            if self._weights is None:  # read once, shared by every package (by reference)
                self._weights = shared_weights(entry.artifact, self.device)
            nets[key] = load_from_bundle(entry.artifact, name, self.cuda, self._weights)
        self._net = self._fn = ShapeDispatch(nets)
        self._hash = f"aoti-{entry.key[:12]}"
        # Graphs only where the build measured one faster; other shapes run "eagerly" (one
        # package call, or the eager network) on the caller's stream.
        self._static = {k for k in self._keys if serve[shape_name(*k)].endswith("_graph")}
        t3 = time.monotonic()
        self._start()
        # Where a start's seconds go (bench/start/warm_start.py keeps these lines).
        compile_log.info("engine_activated: %s on %s, %s", self.spec.model_id, self.device,
                         {"import_s": round(t1 - t0, 3), "lookup_s": round(t2 - t1, 3),
                          "load_s": round(t3 - t2, 3), "graphs_s": round(time.monotonic() - t3, 3)})

    def _eager_net(self) -> Any:
        """The model's own network in the engine precision (a shape the build found faster
        uncompiled); made once."""
        if self._eager_module is None:
            native = native_net(self.spec)
            module, _ = native.fresh(self.device)
            self._eager_module = in_engine_form(module, native, self.device, self.precision)
        return self._eager_module

    def _infer(self, feeds: Mapping[str, np.ndarray], stream: Any) -> InferHandle:
        first = self.spec.inputs[0].name
        if first not in feeds:
            return super()._infer(feeds, stream)  # reports the missing input
        n, item = feeds[first].shape[0], tuple(feeds[first].shape[1:])
        size = min((b for b, i in self._keys if i == item and b >= n), default=None)
        if size is None:
            raise InferenceFailed(f"{self.spec.model_id}: no compiled shape holds a batch of "
                                  f"{n} x {item}; compiled: {self._keys}")
        if size == n:
            return super()._infer(feeds, stream)
        padded = {k: np.concatenate([v, np.repeat(v[-1:], size - n, axis=0)])
                  for k, v in feeds.items()}
        return _Rows(super()._infer(padded, stream), n)

    def _deactivate(self) -> None:
        super()._deactivate()  # the packages go first: they point into the weights
        self._eager_module = self._weights = None
