"""Fault-injection harness shared by the fault tests and the long scripts in bench/faults/.

Everything here drives real processes against a real broker: a steady job feeder, a reader that
watches an output topic, a fleet of `trt-worker run` processes (kill -9, SIGTERM, restart with
the same instance id), a full read of a topic at a given isolation level, and the malformed-job
corpus. No Kafka mocks. One module per part: corpus (jobs, malformed ones), watch (feeding
and reading topics), fleet (worker processes and their logs), scenarios (the drills).
"""

from tests.harness.faults.corpus import (
    FLOOD_LIMITS,
    BadJob,
    good_job,
    header_50k,
    malformed_corpus,
    png_bomb,
    small_images,
)
from tests.harness.faults.fleet import Fleet, exit_reason, log_events, stopped_totals
from tests.harness.faults.scenarios import (
    run_broker_stall,
    run_flood,
    run_kill9,
    run_scaling,
    stall_after,
)
from tests.harness.faults.watch import (
    CLIENT_RECOVERY,
    Audit,
    Feeder,
    OutputWatch,
    TopicWatcher,
    key_counts,
    read_all,
)

__all__ = [
    "CLIENT_RECOVERY", "FLOOD_LIMITS", "Audit", "BadJob", "Feeder", "Fleet", "OutputWatch",
    "TopicWatcher", "exit_reason", "good_job", "header_50k", "key_counts", "log_events",
    "malformed_corpus", "png_bomb", "read_all", "run_broker_stall", "run_flood", "run_kill9",
    "run_scaling", "small_images", "stall_after", "stopped_totals",
]
