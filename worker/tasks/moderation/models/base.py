"""The model protocol of moderation.

A model is a package under :mod:`worker.tasks.moderation.models` (one line in its registry,
:data:`worker.tasks.moderation.models.MODELS`) whose runtime side is a
:class:`ModerationModel`. The moderation task
(:class:`worker.tasks.moderation.task.ModerationTask`) knows models only through it: which jobs
a model can score (:meth:`~ModerationModel.feeds`), its intake check, the parts it makes of a
job (each of a part *kind*, batched per kind over the kind's engine profiles), running a batch
of them, turning a job's collected values into per-label scores under a policy, and its
(model id, engine hash) identity for results.
"""

from __future__ import annotations

import abc
import importlib.util
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

from engines.backends.base import Runner
from engines.profiles import Profile
from worker.config import WorkerConfig
from worker.config.policies import PolicySettings
from worker.tasks.batcher import Batch
from worker.tasks.moderation.parts import JobState, Part
from worker.wire.moderation_jobs import ModerationJob

if TYPE_CHECKING:
    from worker.tasks.moderation.models.text.engine import TextEngine

# A part and what it came back with: the model's value for it, or a JobRejected (the job goes
# to the DLQ: a corrupt image, say).
Finished: TypeAlias = tuple[Part, Any]

TOKENIZERS_MISSING = "the text and CLIP models need the `tokenizers` package"


@dataclass(frozen=True)
class ModelContext:
    """What a model is built from: the config, the served policies that run it, and an
    open_nsfw runner to share (replay, tests; left active at close) or None."""

    cfg: WorkerConfig
    policies: Mapping[str, PolicySettings]
    runner: Runner | None = None


class ModerationModel(abc.ABC):
    """One model of moderation (a name in ``PolicySettings.models``)."""

    name: str
    # What it can score of generated content: a text alone (a prompt), pixels (an image).
    scores_texts: ClassVar[bool] = False
    scores_pixels: ClassVar[bool] = False

    # -- start-up ------------------------------------------------------------------------
    @classmethod
    def runtime_problems(cls, cfg: WorkerConfig, users: str) -> list[str]:
        """Why the model cannot run on this machine (``users``: the policies that run it,
        for the message); empty if it can. Checked for every model before any is built."""
        return []

    @classmethod
    @abc.abstractmethod
    def create(cls, ctx: ModelContext) -> ModerationModel:
        """Build the model's engines, activated, with whatever it precomputes per policy."""

    # -- intake --------------------------------------------------------------------------
    @abc.abstractmethod
    def feeds(self, job: ModerationJob) -> bool:
        """True if the job has what the model scores (an image, some text)."""

    def check(self, job: ModerationJob) -> None:
        """The model's own intake check of a job it feeds (raise a JobRejected); none by
        default."""
        return None

    @abc.abstractmethod
    def profiles(self) -> Mapping[str, tuple[Profile, ...]]:
        """Its part kinds (unique across models), each with its engine's profiles."""

    @abc.abstractmethod
    def parts(self, state: JobState) -> list[Part]:
        """The parts of a job it feeds (``Part.model`` is :attr:`name`)."""

    # -- off the loop's thread -----------------------------------------------------------
    @abc.abstractmethod
    def run(self, kind: str, batch: Batch[Part]) -> list[Finished]:
        """Each part of ``batch`` (all of ``kind``) with its value or its rejection. Anything
        raised fails the batch as a whole: the task isolates it (split down to the part that
        fails alone, whose job is dead-lettered; an outage waits; worker.tasks.batched)."""

    # -- deciding ------------------------------------------------------------------------
    @abc.abstractmethod
    def scores(self, policy: str, values: Mapping[Hashable, Any]) -> dict[str, float]:
        """Per-label scores (and the model's informational ones) of a job under ``policy``,
        from its parts' values by ``Part.key``."""

    @abc.abstractmethod
    def identity(self) -> tuple[str, str]:
        """(model id, engine hash) for the results it scored."""

    # -- generated content (worker.tasks.generation.safety) ------------------------------
    def score_texts(self, policy: str, texts: Sequence[Sequence[str]]) -> list[dict[str, float]]:
        """Scores under ``policy`` of each entry of ``texts``, the texts of one item (a prompt
        and its negative prompt) scored as one text of several chunks. Only where
        ``scores_texts``."""
        raise NotImplementedError(f"model {self.name!r} does not score texts alone")

    def score_pixels(self, policy: str, pixels: Any, captions: Sequence[str]
                     ) -> list[dict[str, float]]:
        """Scores under ``policy`` of each image of ``pixels`` (a torch uint8 tensor
        [N, H, W, 3], RGB, on the CPU or a CUDA device: preprocessing runs where it lives),
        ``captions[i]`` the text image i was asked to show. Only where ``scores_pixels``."""
        raise NotImplementedError(f"model {self.name!r} does not score pixels")

    # -- lifecycle -----------------------------------------------------------------------
    def prefer_gpu(self) -> None:
        """Before :meth:`warm_up`: this model's GPU work goes before other work queued on the
        device (a task beside it in the process yields to it, worker.tasks.gpu_share): its
        own CUDA streams at the device's highest priority. A no-op for a model without streams of
        its own (the text and CLIP towers run on their runners' streams)."""
        return None

    def use_free_sms(self, sms: int) -> bool:
        """Before :meth:`warm_up`: run this model's GPU work only on the ``sms`` SMs another
        task's engines leave free (processing.gpu_disjoint_sms). False for a model that
        cannot (the default; open_nsfw's GPU pipeline can): it runs on every SM."""
        return False

    def warm_up(self) -> None:
        """Called before the first poll (``create`` may already have activated engines)."""
        return None

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        """Release the model's engines and threads."""
        return None


def tokenizers_missing() -> list[str]:
    return [TOKENIZERS_MISSING] if importlib.util.find_spec("tokenizers") is None else []


def embed_parts(engine: TextEngine, parts: list[Part]) -> list[Finished]:
    """Text-tower parts (payload: a chunk of one token bucket, ``shape[0]``) -> embeddings."""
    feeds = engine.tokenizer.pad([p.payload for p in parts], parts[0].shape[0])
    emb = engine.runner.infer(feeds).result()["embedding"]
    return list(zip(parts, emb, strict=True))
