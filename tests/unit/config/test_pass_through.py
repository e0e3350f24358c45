"""The librdkafka pass-through tables (kafka.extra, consumer_extra, producer_extra): secrets in
them are never printed, the settings the guarantees rest on are refused, and settings that
weaken security are warned about."""

from __future__ import annotations

import traceback
import warnings

import pytest

from worker.config import ConfigWarning, is_secret_key, load_config
from worker.exceptions import ConfigError
from worker.kafka.clients import consumer_settings, producer_settings

# Each secret a different value, so a leak names the one that leaked.
SECRETS = {
    ("extra", "ssl.keystore.password"): "keystore-pw-7f3a",
    ("extra", "sasl.oauthbearer.client.secret"): "oauth-secret-91c2",
    ("consumer_extra", "ssl.key.password"): "key-pw-c0ffee",
    ("consumer_extra", "SSL.Key.Password"): "key-pw-upper-5e1d",
    ("producer_extra", "ssl.key.pem"): "-----BEGIN PRIVATE KEY-----pem-2b7e",
    ("producer_extra", "sasl.oauthbearer.token.endpoint.url"): "https://idp/token?k=tok-66aa",
}
SASL_PASSWORD = "sasl-pw-4d4d"


def _tables(**more: dict[str, str]) -> dict[str, dict[str, str]]:
    tables: dict[str, dict[str, str]] = {"extra": {}, "consumer_extra": {}, "producer_extra": {}}
    for (table, key), value in SECRETS.items():
        tables[table][key] = value
    for table, entries in more.items():
        tables[table].update(entries)
    return tables


def _kafka(**more: dict[str, str]) -> dict[str, object]:
    return {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
            "sasl_username": "svc", "sasl_password": SASL_PASSWORD, **_tables(**more)}


def _leaked(text: str) -> list[str]:
    return [s for s in [SASL_PASSWORD, *SECRETS.values()] if s in text]


@pytest.mark.parametrize(("key", "secret"), [
    ("ssl.key.password", True), ("ssl.keystore.password", True), ("sasl.password", True),
    ("ssl.key.pem", True), ("sasl.oauthbearer.client.secret", True),
    ("SASL.OAUTHBEARER.CLIENT.SECRET", True), ("sasl.oauthbearer.token.endpoint.url", True),
    ("sasl.oauthbearer.assertion.private.key.passphrase", True),
    ("sasl.oauthbearer.client.credentials.client.secret", True),
    ("sasl.oauthbearer.assertion.private.key.pem", True),
    ("sasl.oauthbearer.client.id", False), ("https.ca.location", False),
    ("ssl.certificate.pem", False), ("ssl.key.location", False), ("linger.ms", False),
    ("sasl.username", False),
])
def test_secret_settings_are_known_by_name(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_pass_through_secrets_never_show_in_repr_or_dumps() -> None:
    cfg = load_config(None, kafka=_kafka(extra={"socket.keepalive.enable": "true"}))
    dumps = {"repr": repr(cfg), "str": str(cfg), "json": cfg.model_dump_json(),
             "python dump": repr(cfg.model_dump()), "kafka repr": repr(cfg.kafka)}
    for name, text in dumps.items():
        assert _leaked(text) == [], name
        assert "socket.keepalive.enable" in text  # not vacuous: the tables are printed
    # The clients get every value in the clear.
    consumer, producer = consumer_settings(cfg), producer_settings(cfg)
    for (table, key), value in SECRETS.items():
        assert (producer if table == "producer_extra" else consumer)[key] == value
    assert consumer["sasl.password"] == SASL_PASSWORD


def test_a_config_error_shows_no_secret_even_in_its_cause() -> None:
    # A refused setting next to the secrets: pydantic's error for it carries its input, the
    # table or the whole [kafka] section, secrets and all (a long input is shown by its start
    # and end only: the secrets are put there).
    with pytest.raises(ConfigError) as info:
        load_config(None, kafka={"sasl_password": SASL_PASSWORD, "consumer_extra": {
            "ssl.key.password": SECRETS["consumer_extra", "ssl.key.password"],
            "enable.auto.commit": "true",
            "sasl.oauthbearer.client.secret": SECRETS["extra", "sasl.oauthbearer.client.secret"],
        }})
    assert "enable.auto.commit" in str(info.value)
    shown = "".join(traceback.format_exception(info.value))  # with the ValidationError chained
    assert "ValidationError" in shown
    assert _leaked(shown) == []


@pytest.mark.parametrize(("table", "key", "value", "instead"), [
    ("consumer_extra", "auto.offset.reset", "latest", "earliest"),
    ("extra", "auto.offset.reset", "earliest", "earliest"),
    ("consumer_extra", "partition.assignment.strategy", "range", "cooperative-sticky"),
    ("consumer_extra", "group.protocol", "consumer", "cooperative-sticky"),
    ("producer_extra", "transaction.timeout.ms", "900000", "kafka.transaction_timeout_ms"),
    ("extra", "transaction.timeout.ms", "1000", "kafka.transaction_timeout_ms"),
    ("consumer_extra", "Enable.Auto.Commit", "true", "committed by the worker"),
    ("producer_extra", "Enable.Idempotence", "false", "idempotently"),
])
def test_guarantee_settings_are_refused_in_one_line(table: str, key: str, value: str,
                                                    instead: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, kafka={table: {key: value, "ssl.key.password": "pw-0e0e"}})
    lines = [line for line in str(info.value).splitlines() if key in line]
    assert len(lines) == 1, str(info.value)
    assert f"kafka.{table}" in lines[0] and f"{table} may not set {key}" in lines[0]
    assert instead in lines[0]
    assert "pw-0e0e" not in str(info.value)


@pytest.mark.parametrize(("key", "weak", "safe"), [
    ("enable.ssl.certificate.verification", "false", "true"),
    ("ssl.endpoint.identification.algorithm", "none", "https"),
])
@pytest.mark.parametrize("table", ["extra", "consumer_extra", "producer_extra"])
def test_tls_verification_switches_are_accepted_with_a_warning(table: str, key: str, weak: str,
                                                               safe: str) -> None:
    with pytest.warns(ConfigWarning, match=f"kafka.{table} sets {key}={weak}"):
        cfg = load_config(None, kafka={"security_protocol": "SSL", table: {key: weak}})
    assert getattr(cfg.kafka, table)[key] == weak
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, kafka={"security_protocol": "SSL", table: {key: safe}})


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
@pytest.mark.parametrize(("kafka", "named"), [
    ({"sasl_mechanism": "PLAIN", "sasl_username": "svc", "sasl_password": "pw"},
     "sasl_mechanism, sasl_username, sasl_password"),
    ({"sasl_password": "pw"}, "sasl_password"),
    ({"extra": {"sasl.oauthbearer.client.id": "svc"}}, "extra.sasl.oauthbearer.client.id"),
])
def test_sasl_settings_without_sasl_are_warned_about(protocol: str, kafka: dict[str, object],
                                                     named: str) -> None:
    with pytest.warns(ConfigWarning, match=f"kafka sets {named} but security_protocol is "
                                           f"{protocol}"):
        load_config(None, kafka={"security_protocol": protocol, **kafka})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, kafka={"security_protocol": f"SASL_{protocol}", **kafka})
