"""Replace a consumer that lost its partitions and does not get them back once the cluster
answers again.

After a broker outage a member's session expires (partitions lost) and librdkafka rejoins the
group on its own, normally within seconds of the brokers answering. Seen in CI after a 30 s
freeze of a single-node cluster: a client whose group-coordinator connection never came back
(its JoinGroup request sat unsent for minutes) while the cluster answered everyone else; the
worker idled with no partitions until it was stopped. A client created during the outage can
get stuck the same way, so replacing it blindly on a timer does not help; a client created
after the cluster answers joins at once.

So, while partitions are lost, a side thread probes the cluster with a fresh admin client
(:meth:`worker.kafka.admin.Admin.answers`) every second. The worker replaces its consumer
client (:meth:`worker.kafka.Consumer.reopen`) only when the cluster has answered for
``SETTLE_S`` and librdkafka's statistics, taken after that, still show no connection to the
group coordinator: the stuck state itself. A client that is merely rejoining (connected,
waiting for the group) is left alone: replacing it then makes the new member wait for the
old one's join. Replacements are at least ``MIN_GAP_S`` apart, doubling up to ``MAX_GAP_S``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from worker.exceptions import KafkaIOError
from worker.kafka.admin import Admin
from worker.kafka.clients import ClientSettings

SETTLE_S = 1.5
MIN_GAP_S = 10.0
MAX_GAP_S = 300.0
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 2.0


class ClusterProbe:
    """Whether a fresh client gets metadata from the cluster, checked off the loop's thread
    while :attr:`active`; :attr:`answering_since` is when it last started answering."""

    def __init__(self, settings: Mapping[str, Any],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings, self._clock = ClientSettings(settings), clock  # repr masks secrets
        self.answering_since: float | None = None
        self._wake = threading.Event()
        self._active = False
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        return self._active

    def activate(self) -> None:
        self._active = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="cluster-probe", daemon=True)
            self._thread.start()
        self._wake.set()

    def deactivate(self) -> None:
        self._active, self.answering_since = False, None

    def _run(self) -> None:
        while True:
            self._wake.wait(PROBE_EVERY_S)
            self._wake.clear()
            if not self._active:
                continue
            if self._answers():
                if self.answering_since is None:
                    self.answering_since = self._clock()
            else:
                self.answering_since = None

    def _answers(self) -> bool:
        try:
            return Admin(self._settings, timeout=PROBE_TIMEOUT_S).answers()
        except KafkaIOError:  # the client could not even be made (bad settings)
            return False


class Rejoin:
    def __init__(self, probe: ClusterProbe) -> None:
        self.probe = probe
        self._lost = False
        self._gap = MIN_GAP_S
        self._not_before = 0.0
        self.reopens = 0

    def lost(self) -> None:
        self._lost = True
        self.probe.activate()

    def assigned(self) -> None:
        self._lost, self._gap = False, MIN_GAP_S
        self.probe.deactivate()

    def due(self, now: float, coordinator_up: bool | None, stats_at: float | None) -> bool:
        """True when the consumer should be replaced now: lost, the cluster has answered for
        SETTLE_S, and statistics taken since it answered show the consumer not connected to
        its group coordinator (``coordinator_up`` False)."""
        if not self._lost or now < self._not_before:
            return False
        since = self.probe.answering_since
        if since is None or now - since < SETTLE_S:
            return False
        if coordinator_up is not False or stats_at is None or stats_at < since + 1.0:
            return False
        self._not_before = now + self._gap
        self._gap = min(self._gap * 2, MAX_GAP_S)
        self.reopens += 1
        return True
