"""Before the loop: validate the request, then load (resume) or create the replay's state.

Everything that can be wrong with the arguments is found here, before a record is read: an
unknown topic or partition, a bad range, an output topic that is the source or the live
results topic, a state file written for another replay.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from worker.config import WorkerConfig
from worker.kafka.admin import Admin
from worker.tools.replay.exceptions import ReplayError, StateMismatch
from worker.tools.replay.kafka import topic_partitions
from worker.tools.replay.ledger import PartitionLedger
from worker.tools.replay.ranges import Bound
from worker.tools.replay.resolve import resolve_range
from worker.tools.replay.scan import output_ends
from worker.tools.replay.state import ReplayState, load_state


@dataclass(frozen=True)
class ReplayRequest:
    topic: str
    to_topic: str
    start: Bound
    end: Bound
    state_file: Path
    partitions: tuple[int, ...] | None = None
    rate: float | None = None  # jobs per second
    dlq_topic: str | None = None  # None: rejected records are counted, not sent anywhere
    max_records: int | None = None  # stop (resumably) after admitting this many in this run
    checkpoint_interval_s: float = 0.2
    progress: bool = False

    @property
    def bounds(self) -> dict[str, str]:
        return {"from": self.start.text or self.start.kind, "to": self.end.text or self.end.kind}


def check_outputs(cfg: WorkerConfig, admin: Admin, req: ReplayRequest) -> None:
    if req.to_topic == req.topic:
        raise ReplayError("--to-topic must differ from --topic")
    if req.to_topic in (cfg.topics.results, cfg.topics.jobs, cfg.topics.dlq):
        raise ReplayError(
            f"--to-topic {req.to_topic!r} is one of the live worker's topics; replay results "
            "would reach its consumers. Create a separate replay topic."
        )
    if req.dlq_topic is not None and req.dlq_topic in (req.topic, req.to_topic):
        raise ReplayError("--dlq-topic must differ from --topic and --to-topic")
    # UnknownTopic if missing: topics are never auto-created.
    topic_partitions(admin, req.to_topic)
    if req.dlq_topic is not None:
        topic_partitions(admin, req.dlq_topic)


def load_or_create(cfg: WorkerConfig, admin: Admin, req: ReplayRequest
                   ) -> tuple[ReplayState, bool]:
    """The state to run with and whether it is a resume. A new state has no engine yet."""
    state = load_state(req.state_file)
    if state is not None:
        state.check_matches(topic=req.topic, to_topic=req.to_topic, dlq_topic=req.dlq_topic,
                            bounds=req.bounds, partitions=list(req.partitions)
                            if req.partitions is not None else None)
        check_outputs(cfg, admin, req)
        return state, True
    check_outputs(cfg, admin, req)
    ranges = resolve_range(admin, req.topic, req.partitions, req.start, req.end)
    outputs = [req.to_topic] + ([req.dlq_topic] if req.dlq_topic else [])
    ends = {t: output_ends(admin, t) for t in outputs}
    state = ReplayState(
        replay_id=uuid.uuid4().hex[:16], topic=req.topic, to_topic=req.to_topic,
        dlq_topic=req.dlq_topic, bounds=req.bounds, engine="", model="",
        partitions={p: PartitionLedger.fresh(r.start, r.end) for p, r in ranges.items()},
        scan_from={t: dict(e) for t, e in ends.items()},
        output_start={t: dict(e) for t, e in ends.items()},
    )
    return state, False


def bind_engine(state: ReplayState, *, model: str, engine: str, resumed: bool) -> None:
    """A resumed replay must score with the engine it started with, or results would mix."""
    if resumed and state.engine != engine:
        raise StateMismatch(
            f"the replay in this state file was started with engine {state.engine!r}; this "
            f"process loads {engine!r}. Finish it with the same engine, or start a new replay "
            "with another --state-file."
        )
    state.engine, state.model = engine, model
