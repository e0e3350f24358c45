"""CLIP: a job's image zero-shot against each label's prompts, and against its caption."""

from worker.tasks.moderation.models.package import ModelPackage

PACKAGE = ModelPackage(
    name="clip",
    model=f"{__name__}.model:ClipModel",
    settings=f"{__name__}.settings:ClipSettings",
    engine_plans=f"{__name__}.engine:engine_plans",
    describes=True,
    # The probability mass on the neutral prompts, and the image-caption consistency.
    info_labels=("neutral", "consistency"),
    policy_options=("min_consistency",),
    label_options=("clip_prompts",),
    rules=(f"{__name__}.scoring:consistency_rule",),
)
