"""A moderation job's result, assembled once its parts are in: the one place results are made.

Every policy is decided by :func:`worker.tasks.moderation.scoring.policies.evaluate` over the
scores its models gave. One contract detail depends on what the worker serves: a worker with
no ``[moderation.policies]`` (open_nsfw only, the walking skeleton's ``model.policies``)
answers v1 jobs in v1's open_nsfw form, as such workers always have: plain label names, no
rule or models, a ``decode`` timing, and an expired job named after the model that would have
scored it (:func:`single_model_v1`). A v2 result has one form everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from worker.exceptions import NothingToScore
from worker.tasks.moderation.parts import JobState, Pending
from worker.tasks.moderation.scoring.policies import evaluate
from worker.wire.moderation_jobs import RESULT_SCHEMAS, ModerationJob, ModerationResult, Status
from worker.wire.records import Headers
from worker.wire.versions import V1

if TYPE_CHECKING:
    from worker.tasks.moderation.models.base import ModerationModel


def moderation_headers(model_id: str, engine_hash: str, version: int) -> Headers:
    """The headers of a moderation result on the results topic, in contract ``version``."""
    return [("ktw.schema", RESULT_SCHEMAS[version].encode()), ("ktw.model", model_id.encode()),
            ("ktw.engine", engine_hash.encode())]


def nothing_to_score(job: ModerationJob, models: Sequence[str]) -> NothingToScore:
    """The rejection of a job none of its policy's models can feed."""
    has_image, has_text = bool(job.image), bool(job.text and job.text.strip())
    given = ("no image" if has_text else "neither image nor text") if not has_image \
        else "an image and no text"
    return NothingToScore(f"policy {job.policy!r} runs {', '.join(models)} and the job has "
                          f"{given}: nothing to score")


def no_image(job: ModerationJob) -> NothingToScore:
    """The rejection of an image-less job under an open_nsfw-only policy."""
    return nothing_to_score(job, ("open_nsfw",))


def job_result(state: JobState, models: Mapping[str, ModerationModel], now_ms: int, *,
               single_model_v1: bool,
               values: Mapping[str, Mapping[Hashable, Any]] | None = None) -> ModerationResult:
    """The result of a job whose parts are all in (or which expired); ``single_model_v1``:
    see the module's docstring. ``values``: its models' values, when not (yet) in
    ``state.values`` (a one-part job assembled where its part finished)."""
    p, now = state.pending, time.monotonic()
    started = state.started or now
    if state.expired:
        return _expired(p, state, models, now_ms, started, now, single_model_v1)
    policy = p.job.policy
    got = (state.values or {}) if values is None else values
    plain = single_model_v1 and p.job.schema_version == V1  # v1's open_nsfw form
    decision = evaluate(state.policy, {name: models[name].scores(policy, v)
                                       for name, v in got.items()}, qualified=not plain)
    if len(decision.models_run) == 1:  # most policies: no list, no joins
        model_id, engine_hash = models[decision.models_run[0]].identity()
    else:
        ids = [models[m].identity() for m in decision.models_run]
        model_id, engine_hash = "+".join(i for i, _ in ids), "+".join(h for _, h in ids)
    queue, total = (started - p.consumed_at) * 1e3, (now - p.consumed_at) * 1e3
    if single_model_v1:
        decode = min(state.decode_s, now - started)
        timings = {"queue": queue, "decode": decode * 1e3,
                   "infer": (now - started - decode) * 1e3, "total": total}
    else:
        timings = {"queue": queue, "infer": (now - started) * 1e3, "total": total}
    result = ModerationResult(
        id=p.job.id, status=Status.OK, policy=policy, model_id=model_id,
        engine_hash=engine_hash, source=p.ref, timings_ms=timings,
        verdict=decision.verdict, scores=decision.label_scores, rule=decision.rule,
        models=decision.models_run, schema_version=p.job.schema_version)
    if plain:
        result.rule, result.models = None, ()
    return result


def _expired(p: Pending, state: JobState, models: Mapping[str, ModerationModel], now_ms: int,
             started: float, now: float, single_model_v1: bool) -> ModerationResult:
    deadline = p.job.deadline_ms or now_ms
    waited = (now - p.consumed_at) * 1e3
    if single_model_v1:
        ids = [models[m].identity() for m in state.policy.models if m in models]
        return ModerationResult(
            id=p.job.id, status=Status.EXPIRED, policy=p.job.policy,
            model_id="+".join(i for i, _ in ids), engine_hash="+".join(h for _, h in ids),
            source=p.ref, timings_ms={"queue": waited, "total": waited},
            error=f"deadline {deadline} passed {now_ms - deadline} ms before the job reached "
                  "the engine", schema_version=p.job.schema_version)
    return ModerationResult(
        id=p.job.id, status=Status.EXPIRED, policy=p.job.policy, model_id="-", engine_hash="-",
        source=p.ref, timings_ms={"queue": (started - p.consumed_at) * 1e3,
                                  "infer": (now - started) * 1e3, "total": waited},
        error=f"deadline passed {now_ms - deadline} ms before all parts of the job reached "
              "their engines", schema_version=p.job.schema_version)
