"""Topic replay: re-run a range of a jobs topic through the current engine.

A replay reads with its own consumer (``assign()`` only, a throwaway group id, no commits), so
the live consumer group never notices it. Results go to a separate topic with headers naming
the engine and the source record; a state file makes an interrupted replay resumable without
duplicating output; ``--compare`` joins the new results with an older results topic.

Modules: ``ranges`` (bound syntax), ``resolve`` (bounds -> offsets, validation), ``ledger`` and
``state`` (progress and the state file), ``scan`` (what a killed run already wrote), ``parts``
(the replay's consumer, output, committer and start-up parts), ``runner`` (the worker loop over
them), ``compare``/``histogram``/``report`` (what changed), ``cli`` (the command).
"""

from worker.tools.replay.exceptions import (
    BadRange,
    ReplayError,
    StateMismatch,
    UnknownPartition,
    UnknownTopic,
)

__all__ = ["BadRange", "ReplayError", "StateMismatch", "UnknownPartition", "UnknownTopic"]
