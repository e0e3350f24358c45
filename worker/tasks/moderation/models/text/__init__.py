"""The text model (MiniLM sentence embeddings): a job's text, scored against each label's
descriptions."""

from worker.tasks.moderation.models.package import ModelPackage

PACKAGE = ModelPackage(
    name="text",
    model=f"{__name__}.model:TextModel",
    settings=f"{__name__}.settings:TextSettings",
    engine_plans=f"{__name__}.engine:engine_plans",
    describes=True,
)
