"""Client settings carry the secrets in the clear (librdkafka needs them) but never print them:
not in their repr, and not in a traceback that shows every frame's locals."""

from __future__ import annotations

import io

import confluent_kafka as ck
import pytest
from rich.console import Console
from rich.traceback import Traceback

from worker.config import WorkerConfig, load_config
from worker.kafka import Consumer
from worker.kafka.admin import admin_settings
from worker.kafka.clients import (
    ClientSettings,
    consumer_settings,
    member_consumer_settings,
    producer_settings,
    transactional_producer_settings,
)

SECRETS = {"sasl.password": "sasl-pw-1a1a", "ssl.keystore.password": "keystore-pw-2b2b",
           "ssl.key.password": "key-pw-3c3c", "sasl.oauthbearer.client.secret": "oauth-4d4d",
           "ssl.key.pem": "pem-5e5e"}


def _cfg(**consumer_extra: str) -> WorkerConfig:
    return load_config(None, processing={"guarantee": "exactly-once"}, kafka={
        "bootstrap_servers": "127.0.0.1:9", "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN", "sasl_username": "svc",
        "sasl_password": SECRETS["sasl.password"],
        "extra": {"ssl.keystore.password": SECRETS["ssl.keystore.password"]},
        "consumer_extra": {"ssl.key.password": SECRETS["ssl.key.password"],
                           "sasl.oauthbearer.client.secret":
                               SECRETS["sasl.oauthbearer.client.secret"], **consumer_extra},
        "producer_extra": {"ssl.key.pem": SECRETS["ssl.key.pem"]}})


def _leaked(text: str) -> list[str]:
    return [value for value in SECRETS.values() if value in text]


@pytest.mark.parametrize("build", [consumer_settings, member_consumer_settings, producer_settings,
                                   transactional_producer_settings, admin_settings])
def test_settings_hold_the_secrets_but_never_print_them(build: object) -> None:
    settings = build(_cfg())  # type: ignore[operator]
    assert isinstance(settings, ClientSettings)
    assert settings["sasl.password"] == SECRETS["sasl.password"]  # librdkafka gets the value
    for text in (repr(settings), str(settings), f"{settings}", repr(settings.copy()),
                 repr(settings | {"group.id": "reader"}), repr([settings])):
        assert _leaked(text) == []
        assert "sasl.username" in text and "svc" in text  # not vacuous: settings are printed
        assert "sasl.password" in text


def test_a_traceback_with_locals_of_a_failed_consumer_shows_no_secret() -> None:
    # An unknown setting: librdkafka refuses the consumer in open(), whose frame holds the
    # settings. Rendered as rich renders a traceback with every local (no length limits).
    consumer = Consumer(consumer_settings(_cfg(**{"no.such.property": "x"})))
    with pytest.raises(ck.KafkaException) as info:
        consumer.open()
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(Traceback.from_exception(
        info.type, info.value, info.tb, show_locals=True, locals_max_length=None,
        locals_max_string=None))
    text = out.getvalue()
    assert "no.such.property" in text and "settings" in text  # the frame and its locals
    assert _leaked(text) == []


def test_the_tools_and_side_threads_keep_their_settings_masked() -> None:
    """Every client settings the replay and the loop's side threads (cluster probe, orphan
    watch) hold print no secret; the replay's admin settings were once a plain dict."""
    from worker.kafka.clients import common_settings, reader_settings
    from worker.loop.group.orphans import OrphanWatch
    from worker.loop.group.rejoin import ClusterProbe
    from worker.tools.replay.kafka import (
        admin_settings as replay_admin_settings,
    )
    from worker.tools.replay.kafka import (
        replay_consumer_settings,
        replay_producer_settings,
    )

    cfg = _cfg()
    held = [replay_admin_settings(cfg), replay_consumer_settings(cfg, "r"),
            replay_producer_settings(cfg), reader_settings(cfg, "g"),
            ClusterProbe(common_settings(cfg.kafka))._settings,
            OrphanWatch(common_settings(cfg.kafka), "g", "jobs", 45_000)._settings]
    for settings in held:
        assert settings["sasl.password"] == SECRETS["sasl.password"]
        assert "sasl.password" in repr(settings) and _leaked(repr(settings)) == []
