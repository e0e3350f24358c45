"""Rate limiter, replay headers, client settings and the command line (no broker)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from worker.config import load_config
from worker.tools.cli import app
from worker.tools.replay import BadRange
from worker.tools.replay.headers import parse_written, result_headers
from worker.tools.replay.kafka import (
    admin_settings,
    replay_consumer_settings,
    replay_producer_settings,
)
from worker.tools.replay.ratelimit import RateLimiter
from worker.wire.records import SourceRef


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_limiter() -> None:
    clock = Clock()
    lim = RateLimiter(10.0, clock=clock)
    assert lim.available(100) == 1, "no burst at start"
    lim.take(1)
    assert lim.available(100) == 0 and lim.wait_s() == pytest.approx(0.1)
    clock.t += 0.5
    assert lim.available(100) == 5
    lim.take(5)
    clock.t += 60
    assert lim.available(100) == 10, "bursts are capped at one second's worth"
    assert RateLimiter(None).available(7) == 7 and RateLimiter(None).wait_s() == 0
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_headers_round_trip() -> None:
    h = result_headers("open_nsfw", "ort-1", "rid", SourceRef("jobs", 3, 42))
    d = dict(h)
    assert d["ktw.model"] == b"open_nsfw" and d["ktw.engine"] == b"ort-1"
    assert d["ktw.source.topic"] == b"jobs"
    w = parse_written(h)
    assert w is not None and (w.replay_id, w.partition, w.offset, w.reason) == ("rid", 3, 42,
                                                                                 None)
    dlq = [("ktw.dlq.source.partition", b"1"), ("ktw.dlq.source.offset", b"9"),
           ("ktw.dlq.error.reason", b"schema"), ("ktw.replay.id", b"rid")]
    w = parse_written(dlq)
    assert w is not None and (w.partition, w.offset, w.reason) == (1, 9, "schema")
    assert parse_written([("ktw.source.offset", b"1")]) is None, "not written by a replay"
    assert parse_written(None) is None


def test_client_settings_never_commit_and_produce_idempotently() -> None:
    cfg = load_config(None, kafka={"bootstrap_servers": "b:9092", "group_id": "live"})
    c = replay_consumer_settings(cfg, "rid")
    assert c["group.id"] == "ktw-replay-rid" != "live"
    assert c["enable.auto.commit"] is False and c["enable.auto.offset.store"] is False
    p = replay_producer_settings(cfg)
    assert p["enable.idempotence"] is True and p["acks"] == "all"
    a = admin_settings(cfg)
    assert a["bootstrap.servers"] == "b:9092" and "group.id" not in a


def test_cli_refuses_bad_bounds_before_connecting() -> None:
    result = CliRunner().invoke(app, ["replay", "--topic", "t", "--to-topic", "r",
                                      "--from", "9", "--to", "2"])
    assert isinstance(result.exception, BadRange)
    assert "before --from" in str(result.exception)


def test_cli_help_lists_the_options() -> None:
    result = CliRunner().invoke(app, ["replay", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for opt in ("--topic", "--from", "--to", "--to-topic", "--rate", "--partitions",
                "--state-file", "--compare", "--report-dir", "--dlq-topic"):
        assert opt in result.output


def test_progress_shows_rate_and_eta() -> None:
    import io

    from rich.console import Console

    from worker.tools.replay import progress as mod

    now = [1000.0]
    console = Console(file=io.StringIO(), force_terminal=True, width=150, record=True)
    with mod.ReplayProgress("replay jobs", total=100, done=10, enabled=True,
                            console=console, clock=lambda: now[0]) as bar:
        for step in range(1, 5):
            now[0] += 1.0
            bar.update(10 + 5 * step)  # 5 jobs/s
        bar.render()
    text = console.export_text()
    assert "30/100" in text and "5.0 jobs/s" in text
    assert "ETA 0:00:14" in text, text  # 70 left at 5 jobs/s


def test_a_dlq_records_coordinates_come_from_the_workers_own_headers() -> None:
    from worker.tools.replay.headers import parse_written

    headers = [("ktw.source.partition", b"0"), ("ktw.source.offset", b"7"),  # from the job
               ("ktw.dlq.error.reason", b"schema"), ("ktw.dlq.source.partition", b"2"),
               ("ktw.dlq.source.offset", b"41"), ("ktw.replay.id", b"r-1")]
    w = parse_written(headers)
    assert w is not None and (w.partition, w.offset, w.reason) == (2, 41, "schema")
