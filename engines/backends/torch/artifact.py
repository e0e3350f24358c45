"""The torch backend's artifact: the native network's weights in the engine precision.

Built from the spec's :class:`~engines.spec.NativeNet` (``fresh``) and saved with ``torch.save``;
loaded into the network's ``skeleton`` (every parameter overwritten by a strict load, the state
dict memory-mapped and copied once into the parameters). torch is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.cache import BuildRecipe, CacheEntry
from engines.exceptions import BackendUnavailable
from engines.spec import EngineSpec, NativeNet

if TYPE_CHECKING:
    from engines.assembly import EnginePlan

DTYPES = {"fp32": "float32", "fp16": "float16"}


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def native_net(spec: EngineSpec) -> NativeNet:
    if spec.native is None:
        raise BackendUnavailable(f"{spec.model_id}: the spec names no native network, which "
                                 "the torch backend runs")
    return spec.native


def in_engine_form(module: Any, native: NativeNet, device: str, precision: str) -> Any:
    """The network as an engine runs it: on ``device``, in ``precision``, channels-last where
    the model says so, in eval mode."""
    import torch

    net = module.to(device=device, dtype=getattr(torch, DTYPES[precision]))
    if native.channels_last:
        net = net.to(memory_format=torch.channels_last)
    return net.eval()


def build_torch_engine(plan: EnginePlan, recipe: BuildRecipe, out: Path) -> None:
    """The registry's builder: the fresh network's state dict in the plan's precision."""
    import torch

    native = native_net(plan.spec)
    where = plan.params.device if native.build_on_target else "cpu"
    module, _ = native.fresh(where)
    net = module.to(getattr(torch, DTYPES[plan.params.precision]))
    torch.save({k: v.cpu() for k, v in net.state_dict().items()}, out)


def load_native(native: NativeNet, device: str, precision: str,
                engine: Callable[[], CacheEntry] | None) -> tuple[Any, str]:
    """(network with its weights, engine hash): from the cached artifact when there is a cache,
    else freshly built from the model's weights."""
    if engine is None:
        module, weights = native.fresh(device)
        return module, f"torch-{torch_version()}-{precision}-{weights[:12]}"
    if native.skeleton is None:
        raise BackendUnavailable("this network has no skeleton to load a cached artifact into")
    import torch

    entry = engine()
    # Every parameter is overwritten (strict load), so the skeleton need not initialise any; the
    # state dict is memory-mapped and copied once into the parameters. Measured on the H200
    # (bench/generation/sd_load_profile.py): 0.5 s (one run) instead of 1.35 s (median of two)
    # for the three SD 1.5 engines. The skeleton takes the artifact's precision before the load:
    # into float32 parameters, each fp16 tensor was converted on the CPU and copied at twice its
    # size (the SD UNet's load took 0.9-1.0 s of a warm start, bench/NOTES.md).
    net = native.skeleton(device).to(dtype=getattr(torch, DTYPES[precision]))
    state = torch.load(entry.artifact, map_location="cpu", weights_only=True, mmap=True)
    net.load_state_dict(state, strict=True)
    return net, f"torch-{entry.key[:12]}"
