"""open_nsfw: Yahoo's NSFW image classifier, scoring the label ``nsfw`` (and ``sfw``).

Its settings are the ``[model]`` section (:class:`worker.config.model.ModelSettings`): the
worker's first model, whose engine options (backend, profiles, device) the other models follow
unless their own sections say otherwise.
"""

from worker.tasks.moderation.models.package import ModelPackage

PACKAGE = ModelPackage(
    name="open_nsfw",
    model=f"{__name__}.model:OpenNsfwModel",
    engine_plans=f"{__name__}.engine:engine_plans",
    fixed_labels={"nsfw": (0.2, 0.8)},  # Yahoo's: < 0.2 safe, > 0.8 NSFW
    info_labels=("sfw",),
)
