"""Secrets given to the worker (kafka.sasl_password and the passwords, keys and tokens of the
librdkafka pass-through tables) never reach its output: not in an error, a log line or a
traceback, in either log format.

No broker is needed: a refused pass-through setting stops `trt-worker run` at config
validation, before the worker looks for brokers or builds a client.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SECRETS = {
    "sasl_password": "sasl-pw-9e1f77",
    "ssl.keystore.password": "keystore-pw-41ac02",
    "ssl.key.password": "key-pw-d3b5c8",
    "sasl.oauthbearer.client.secret": "oauth-secret-7a2e90",
    "ssl.key.pem": "-----BEGIN PRIVATE KEY-----pem-b84f13",
}
TRT_WORKER = Path(sys.executable).with_name("trt-worker")


def _env() -> dict[str, str]:
    # Nothing from the caller's environment may configure the worker: only the file does.
    return {k: v for k, v in os.environ.items()
            if not k.startswith("KTW_") and k != "KAFKA_BOOTSTRAP_SERVERS"}


def _leaked(*texts: str) -> list[str]:
    return [name for name, value in SECRETS.items() if any(value in t for t in texts)]


@pytest.mark.skipif(not TRT_WORKER.exists(),
                    reason="the trt-worker console script is not installed next to this Python "
                           "(pip install -e .)")
@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_refused_consumer_setting_stops_the_worker_without_printing_secrets(
        fmt: str, tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(textwrap.dedent(f"""\
        [kafka]
        security_protocol = "SASL_SSL"
        sasl_mechanism = "PLAIN"
        sasl_username = "svc-moderation"
        sasl_password = "{SECRETS['sasl_password']}"
        [kafka.extra]
        "ssl.keystore.password" = "{SECRETS['ssl.keystore.password']}"
        [kafka.consumer_extra]
        "auto.offset.reset" = "latest"
        "ssl.key.password" = "{SECRETS['ssl.key.password']}"
        "sasl.oauthbearer.client.secret" = "{SECRETS['sasl.oauthbearer.client.secret']}"
        [kafka.producer_extra]
        "ssl.key.pem" = "{SECRETS['ssl.key.pem']}"
        [log]
        format = "{fmt}"
        [metrics]
        port = 0
        """))
    proc = subprocess.run([str(TRT_WORKER), "run", "--config", str(config)], env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    named = [line for line in proc.stderr.splitlines() if "auto.offset.reset" in line]
    assert len(named) == 1 and "consumer_extra may not set auto.offset.reset" in named[0], out
    assert "Traceback" not in out
    assert _leaked(proc.stdout, proc.stderr) == []


# A standard-library logger (librdkafka's, a library's) logs an exception raised in a frame
# whose locals hold secrets, as client settings do.
_FOREIGN_EXCEPTION = """
import logging, sys
from worker.logs import configure_logging

configure_logging("INFO", sys.argv[1])

def connect(settings):
    raise ValueError("handshake failed")

try:
    connect({secrets!r})
except ValueError:
    logging.getLogger("some.library").exception("connect_failed")
"""


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_logged_traceback_shows_no_locals(fmt: str) -> None:
    script = _FOREIGN_EXCEPTION.format(secrets=SECRETS)
    proc = subprocess.run([sys.executable, "-c", script, fmt], env=_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The traceback is there (its frame and error), its locals are not.
    assert "connect_failed" in proc.stderr and "handshake failed" in proc.stderr, proc.stderr
    assert "in connect" in proc.stderr, proc.stderr
    assert _leaked(proc.stdout, proc.stderr) == []
