"""Engine profiles: which input shapes an engine accepts and which batch sizes it offers.

A profile is either a **static** bucket set (fixed item shape, a few batch sizes: fastest on
GPUs, one CUDA graph or TensorRT profile each; smaller batches are padded up) or a **range**
(min/opt/max batch, a TensorRT optimization profile; any batch size inside, no padding).
Shapes here are per item (without the batch dimension); -1 in an item shape means "any".
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class StaticProfile:
    name: str
    item_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    kind: Literal["static"] = "static"

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"profile {self.name}: batch sizes must be >= 1")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError(f"profile {self.name}: batch sizes must be strictly increasing")

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def fits(self, item_shape: tuple[int, ...]) -> bool:
        return _shape_fits(item_shape, self.item_shape, self.item_shape)

    def padded(self, n: int) -> int:
        """The smallest offered batch size holding ``n`` items."""
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"profile {self.name}: batch of {n} outside 1..{self.max_batch}")
        return self.batch_sizes[bisect.bisect_left(self.batch_sizes, n)]

    def largest_full(self, n: int) -> int:
        """The largest offered batch size not above ``n`` (0 if none)."""
        i = bisect.bisect_right(self.batch_sizes, n)
        return self.batch_sizes[i - 1] if i else 0

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "item_shape": list(self.item_shape),
                "batch_sizes": list(self.batch_sizes)}


@dataclass(frozen=True, slots=True)
class RangeProfile:
    name: str
    min_item: tuple[int, ...]
    opt_item: tuple[int, ...]
    max_item: tuple[int, ...]
    min_batch: int
    opt_batch: int
    max_batch: int
    kind: Literal["range"] = "range"

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError(f"profile {self.name}: need 1 <= min <= opt <= max batch")
        dims = (self.min_item, self.opt_item, self.max_item)
        if len({len(d) for d in dims}) != 1:
            raise ValueError(f"profile {self.name}: min/opt/max item shapes differ in rank")
        for lo, mid, hi in zip(*dims, strict=True):
            if not lo <= mid <= hi:
                raise ValueError(f"profile {self.name}: need min <= opt <= max in every dim")

    def fits(self, item_shape: tuple[int, ...]) -> bool:
        return _shape_fits(item_shape, self.min_item, self.max_item)

    def padded(self, n: int) -> int:
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"profile {self.name}: batch of {n} outside 1..{self.max_batch}")
        return max(n, self.min_batch)

    def largest_full(self, n: int) -> int:
        return min(n, self.max_batch) if n >= self.min_batch else 0

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind, "min_item": list(self.min_item),
                "opt_item": list(self.opt_item), "max_item": list(self.max_item),
                "min_batch": self.min_batch, "opt_batch": self.opt_batch,
                "max_batch": self.max_batch}


Profile = StaticProfile | RangeProfile


def _shape_fits(shape: tuple[int, ...], lo: tuple[int, ...], hi: tuple[int, ...]) -> bool:
    if len(shape) != len(lo):
        return False
    return all((a == -1 or a <= s) and (b == -1 or s <= b)
               for s, a, b in zip(shape, lo, hi, strict=True))


def profile_for(profiles: tuple[Profile, ...], item_shape: tuple[int, ...]) -> Profile | None:
    """The first profile that accepts ``item_shape`` (profiles are listed best-first)."""
    for p in profiles:
        if p.fits(item_shape):
            return p
    return None
