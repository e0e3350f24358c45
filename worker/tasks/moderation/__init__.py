"""Moderation: jobs of an image and/or a text, scored under a policy.

``factory.moderation_task`` picks the task: open_nsfw alone (``open_nsfw.OpenNsfwTask``) when no
``[moderation.policies]`` are configured, image-and-text moderation
(``policy_task.PolicyModerationTask``, its models plug-ins under ``models/``) otherwise.
"""
