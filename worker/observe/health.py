"""Liveness and readiness, as the HTTP endpoints answer them.

- healthy (``/healthz``): the loop stepped within ``metrics.heartbeat_timeout_s``. A worker
  stuck in a call that never returns fails it and is restarted by its orchestrator.
- ready (``/readyz``): engines warm, subscribed, not stopping, no fatal error, the assignment not
  lost (a broker stall past the session timeout loses it until the rejoin), and no record left
  unacknowledged for ``metrics.delivery_stall_s`` (a broker that stopped answering the
  producers), and nothing blocking outputs (the committer waiting out a cluster that does not
  answer, or an output topic refused). Having no partitions is ready: more members than
  partitions is normal.

``/readyz`` names every reason that holds, one a line (at most :data:`MAX_REASONS`, then a
count of the rest): an operator fixing the first should not find a second only afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from worker.observe.vitals import Vitals

MAX_REASONS = 8


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reasons: tuple[str, ...]

    def text(self) -> str:
        return "ok\n" if self.ok else "".join(f"{r}\n" for r in self.reasons)


class Probes(Protocol):
    """What the HTTP endpoints ask (:class:`Health`, :class:`TasksHealth`)."""

    def live(self) -> Verdict: ...

    def ready(self) -> Verdict: ...


class Health:
    def __init__(self, vitals: Vitals, *, heartbeat_timeout_s: float, delivery_stall_s: float,
                 fatal: Callable[[], BaseException | None],
                 oldest_unacked_s: Callable[[], float | None],
                 blocked: Sequence[Callable[[], str | None]] = ()) -> None:
        """``blocked``: each part that may hold outputs or batches back (the committer, the
        partition hold, the task, the ACL watch), asked for its reason every time."""
        self.vitals = vitals
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.delivery_stall_s = delivery_stall_s
        self._fatal = fatal
        self._oldest_unacked_s = oldest_unacked_s
        self._blocked = blocked

    def live(self) -> Verdict:
        age = time.monotonic() - self.vitals.beat
        if age > self.heartbeat_timeout_s:
            return Verdict(False, (f"loop has not stepped for {age:.0f} s",))
        return Verdict(True, ())

    def ready(self) -> Verdict:
        v, reasons = self.vitals, []
        if not v.warm:
            reasons.append("engines not warm yet")
        if not v.subscribed:
            reasons.append("not subscribed yet")
        if v.waiting is not None:
            reasons.append(v.waiting)
        if v.stopping:
            reasons.append("stopping")
        fatal = self._fatal()
        if fatal is not None:
            reasons.append(f"fatal error: {type(fatal).__name__}: {str(fatal)[:200]}")
        if v.lost:
            reasons.append("partitions lost (no contact with the group coordinator)")
        waited = self._oldest_unacked_s()
        if waited is not None and waited > self.delivery_stall_s:
            reasons.append(f"a record unacknowledged for {waited:.0f} s")
        reasons.extend(r for r in (why() for why in self._blocked) if r is not None)
        reasons.extend(self.live().reasons)
        return Verdict(not reasons, _capped(reasons))


class TasksHealth:
    """A process serving several tasks: live while every loop steps, ready while every loop is
    ready (a job of either task would otherwise wait on a process the orchestrator counts as
    serving); each reason names its task."""

    def __init__(self, healths: Mapping[str, Probes]) -> None:
        self.healths = dict(healths)

    def live(self) -> Verdict:
        return self._all({task: h.live() for task, h in self.healths.items()})

    def ready(self) -> Verdict:
        return self._all({task: h.ready() for task, h in self.healths.items()})

    @staticmethod
    def _all(verdicts: Mapping[str, Verdict]) -> Verdict:
        reasons = [f"{task}: {r}" for task, v in verdicts.items() for r in v.reasons]
        return Verdict(all(v.ok for v in verdicts.values()), _capped(reasons))


def _capped(reasons: list[str]) -> tuple[str, ...]:
    """At most MAX_REASONS lines, the last of a longer list saying how many more there are."""
    if len(reasons) > MAX_REASONS:
        more = len(reasons) - (MAX_REASONS - 1)
        reasons = [*reasons[:MAX_REASONS - 1], f"and {more} more reasons"]
    return tuple(reasons)
