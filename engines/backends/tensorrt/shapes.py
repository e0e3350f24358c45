"""Engine profiles -> TensorRT optimization profiles (pure; no tensorrt import)."""

from __future__ import annotations

from dataclasses import dataclass

from engines.profiles import Profile, RangeProfile, StaticProfile


@dataclass(frozen=True, slots=True)
class OptShapes:
    """One TensorRT optimization profile for one input: full shapes with the batch dim."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def optimization_profiles(profiles: tuple[Profile, ...], item_shape: tuple[int, ...]
                          ) -> list[OptShapes]:
    """A static profile gives one fixed-shape TensorRT profile per batch size (each gets its
    own tuned kernels); a range profile gives one min/opt/max profile."""
    out: list[OptShapes] = []
    for p in profiles:
        if isinstance(p, StaticProfile):
            if any(d < 0 for d in p.item_shape):
                raise ValueError(f"static profile {p.name} has a dynamic item dim")
            for b in p.batch_sizes:
                shape = (b, *p.item_shape)
                out.append(OptShapes(f"{p.name}/b{b}", shape, shape, shape))
        elif isinstance(p, RangeProfile):
            out.append(OptShapes(p.name, (p.min_batch, *p.min_item), (p.opt_batch, *p.opt_item),
                                 (p.max_batch, *p.max_item)))
    if not out:
        raise ValueError("no profiles")
    for o in out:
        if len(o.min) != len(item_shape) + 1:
            raise ValueError(f"profile {o.name}: rank {len(o.min)} does not match the input")
    return out


def profile_index_for(shapes: list[OptShapes], batch_shape: tuple[int, ...]) -> int:
    """The first optimization profile whose [min, max] box contains ``batch_shape``."""
    for i, o in enumerate(shapes):
        if all(lo <= s <= hi for s, lo, hi in zip(batch_shape, o.min, o.max, strict=True)):
            return i
    raise ValueError(f"no optimization profile accepts shape {batch_shape}")
