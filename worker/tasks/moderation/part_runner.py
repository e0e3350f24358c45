"""Running a batch of parts on its model, and turning a complete job into its result.

Everything here loops over the model plug-ins (:mod:`worker.tasks.moderation.models`): no
model is named.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from engines.exceptions import InferenceFailed
from engines.profiles import Profile
from worker.tasks.batcher import Batch
from worker.tasks.moderation.models.base import Finished, ModerationModel
from worker.tasks.moderation.parts import JobState, Part, PartFailed, mark_started
from worker.tasks.moderation.scoring.policies import Decision, ScoresByModel, evaluate
from worker.wire.moderation_jobs import ModerationResult, Status, Verdict


class Models:
    """The model plug-ins a task runs, by name (in registry order) and by part kind."""

    def __init__(self, models: Mapping[str, ModerationModel]) -> None:
        self.by_name = dict(models)
        self.by_kind: dict[str, ModerationModel] = {}
        for model in self.by_name.values():
            for kind in model.profiles():
                if kind in self.by_kind:
                    raise ValueError(f"part kind {kind!r} of model {model.name!r} is already "
                                     f"{self.by_kind[kind].name!r}'s")
                self.by_kind[kind] = model

    def profiles(self) -> dict[str, tuple[Profile, ...]]:
        """Every part kind with its engine's profiles."""
        return {kind: profiles for model in self.by_name.values()
                for kind, profiles in model.profiles().items()}

    def identity(self, model: str) -> tuple[str, str]:
        """(model id, engine hash) for a result."""
        return self.by_name[model].identity()

    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        """Off the loop's thread: the batch's parts with their values."""
        for part in batch.items:
            mark_started(part.state)
        try:
            return self.by_kind[kind].run(kind, batch)
        except InferenceFailed as exc:
            return [(p, PartFailed(str(exc))) for p in batch.items]


def scores_of(models: Models, state: JobState) -> ScoresByModel:
    """Each model's scores of a complete job, under the job's policy."""
    policy = state.pending.job.policy
    return {name: models.by_name[name].scores(policy, values)
            for name, values in state.values.items()}


def decide(models: Models, state: JobState, now_ms: int
           ) -> tuple[ModerationResult, Decision | None]:
    p, now = state.pending, time.monotonic()
    started = state.started or now
    timings = {"queue": (started - p.consumed_at) * 1e3, "infer": (now - started) * 1e3,
               "total": (now - p.consumed_at) * 1e3}

    def result(status: Status, model_id: str = "-", engine_hash: str = "-", *,
               verdict: Verdict | None = None, scores: dict[str, float] | None = None,
               error: str | None = None, rule: str | None = None,
               models_run: tuple[str, ...] = ()) -> ModerationResult:
        return ModerationResult(id=p.job.id, status=status, policy=p.job.policy,
                                model_id=model_id, engine_hash=engine_hash, source=p.ref,
                                timings_ms=timings, verdict=verdict, scores=scores or {},
                                error=error, rule=rule, models=models_run,
                                schema_version=p.job.schema_version)

    if state.expired:
        late = now_ms - (p.job.deadline_ms or now_ms)
        return result(Status.EXPIRED, error=f"deadline passed {late} ms before all parts of "
                                            "the job reached their engines"), None
    if state.error is not None:
        return result(Status.ERROR, error=state.error), None
    decision = evaluate(state.policy, scores_of(models, state))
    ids = [models.identity(m) for m in decision.models_run]
    return result(Status.OK, "+".join(i for i, _ in ids), "+".join(h for _, h in ids),
                  verdict=decision.verdict, scores=decision.label_scores,
                  rule=decision.rule, models_run=decision.models_run), decision
