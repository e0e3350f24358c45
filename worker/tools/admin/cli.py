"""``trt-worker topics create``, ``trt-worker lag`` and ``trt-worker dlq redrive``.

Imports stay light here (typer): Kafka loads only when a command runs. Exit status: 0 done,
1 done but something needs the operator (listed), 2 error (nothing or only part done).
"""

from __future__ import annotations

from typing import Annotated

import typer

from worker.tools.admin.common import EXIT_PROBLEM, BootstrapOpt, TaskOpt
from worker.tools.options import ConfigOpt

topics_app = typer.Typer(no_args_is_help=True, help="Create the worker's topics.")
dlq_app = typer.Typer(no_args_is_help=True, help="Dead-letter queue tools.")


@topics_app.command("create")
def topics_create(
    partitions: Annotated[int | None, typer.Option(
        min=1, help="Jobs topic partitions (default: the broker's num.partitions).")] = None,
    results_partitions: Annotated[int | None, typer.Option(
        min=1, help="Results topic partitions (default: the jobs topic's count).")] = None,
    dlq_partitions: Annotated[int | None, typer.Option(
        min=1, help="DLQ partitions (default: the jobs topic's count).")] = None,
    replication_factor: Annotated[int | None, typer.Option(
        min=1, help="Replicas per partition (default: the broker's "
                    "default.replication.factor).")] = None,
    topic_config: Annotated[list[str] | None, typer.Option(
        "--topic-config", help="key=value for all three topics, repeatable (e.g. "
        "retention.ms=604800000). The jobs topic's max.message.bytes defaults to "
        "limits.max_message_bytes plus 64 KiB; the DLQ's is always the jobs topic's plus "
        "64 KiB.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Show (and have the broker validate) what would be created.")] = False,
    task: TaskOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
) -> None:
    """Create the configured jobs, results and DLQ topics (idempotent).

    Existing topics are reported, never altered. A new jobs topic's max.message.bytes is
    limits.max_message_bytes plus 64 KiB (for the key and headers), so it takes every job the
    worker takes; a jobs topic below that is noted. The DLQ's is the jobs topic's effective
    value plus 64 KiB; an existing DLQ below the jobs topic's is reported as a problem
    (exit 1).
    """
    from worker.tools.admin.common import load
    from worker.tools.admin.report import print_topics
    from worker.tools.admin.topics import Request, parse_topic_configs
    from worker.tools.admin.topics_create import create_topics

    req = Request(partitions, results_partitions, dlq_partitions, replication_factor,
                  parse_topic_configs(topic_config or []))
    outcome = create_topics(load(config, bootstrap_servers, task), req, dry_run=dry_run)
    print_topics(outcome)
    if outcome.problems:
        raise typer.Exit(EXIT_PROBLEM)


def lag(
    group: Annotated[str | None, typer.Option(
        "--group", "-g", help="Consumer group (default: kafka.group_id).")] = None,
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", help="Topic (default: the task's jobs topic).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    task: TaskOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
) -> None:
    """Show a consumer group's lag per partition and in total.

    Per partition: the committed offset, the log start (low), the high watermark and the lag
    (high - committed). A partition without a commit counts every retained record (high - low).
    """
    from worker.tools.admin.common import load, task_topics
    from worker.tools.admin.lag import read_lag
    from worker.tools.admin.report import print_lag

    cfg = load(config, bootstrap_servers, task)
    report = read_lag(cfg, group or cfg.kafka.group_id, topic or task_topics(cfg).jobs)
    print_lag(report, as_json=json_)


@dlq_app.command("redrive")
def dlq_redrive(
    reason: Annotated[list[str] | None, typer.Option(
        "--reason", "-r", help="Only dead letters with this ktw.dlq.error.reason (repeatable "
        "or comma-separated; default: any).")] = None,
    since: Annotated[str | None, typer.Option(
        help="Only records dead-lettered at or after this ISO-8601 time (with a zone).")] = None,
    until: Annotated[str | None, typer.Option(
        help="Stop at records dead-lettered at or after this ISO-8601 time; they stay for a "
             "later run.")] = None,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Re-send at most N jobs this run; the rest stay for a later run.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Report what would be re-sent; send and commit nothing.")] = False,
    to_topic: Annotated[str | None, typer.Option(
        help="Where the jobs go (default: the task's jobs topic).")] = None,
    group: Annotated[str | None, typer.Option(
        "--group", "-g", help="The redrive's progress group (default: "
        "<kafka.group_id>.redrive).")] = None,
    task: TaskOpt = None,
    config: ConfigOpt = None,
    bootstrap_servers: BootstrapOpt = None,
) -> None:
    """Re-send dead-lettered jobs (original key, value and headers) to the jobs topic.

    Reads the DLQ from where this redrive group left off and commits its progress only after
    every re-sent job is acknowledged: a second run re-sends nothing the first sent. Records
    not matching --reason/--since are passed over for good by this group. By-reference dead
    letters are fetched again from their source topic; those no longer retained are listed
    as skipped (exit 1).
    """
    from worker.tools.admin.common import load
    from worker.tools.admin.deadletters import Filter, parse_time
    from worker.tools.admin.redrive import RedriveRequest, redrive

    reasons = frozenset(r.strip() for item in reason or [] for r in item.split(",") if r.strip())
    flt = Filter(reasons, parse_time(since, "--since") if since else None,
                 parse_time(until, "--until") if until else None)
    req = RedriveRequest(flt, limit, dry_run, to_topic, group)
    summary = redrive(load(config, bootstrap_servers, task), req)
    for line in summary.lines():
        typer.echo(line)
    if summary.skipped:
        raise typer.Exit(EXIT_PROBLEM)
