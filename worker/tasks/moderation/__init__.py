"""Moderation: jobs of an image and/or a text, scored under a policy by its models.

``task.ModerationTask`` serves every policy (``factory.moderation_task`` builds it); each model
is a package under ``models/`` (one registry line in ``models.MODELS``).
"""
