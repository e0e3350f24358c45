"""worker.config: sources and their order, validation messages, secrets, immutability."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pydantic
import pytest

from worker.config import Thresholds, WorkerConfig, load_config
from worker.exceptions import ConfigError

SECRET = "hunter2-do-not-log"


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(text)
    return path


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_load_without_any_source() -> None:
    cfg = load_config()
    assert isinstance(cfg, WorkerConfig)
    assert cfg.kafka.bootstrap_servers == ""
    assert cfg.kafka.group_id == "trt-worker"
    assert (cfg.topics.jobs, cfg.topics.results, cfg.topics.dlq) == (
        "moderation.jobs", "moderation.results", "moderation.dlq")
    assert cfg.batch.max_batch_size == 16
    assert cfg.batch.low_watermark < cfg.batch.high_watermark
    assert cfg.limits.max_image_bytes == 20 * 1024 * 1024
    assert cfg.model.backend == "onnxruntime"
    assert cfg.model.jpeg_roundtrip is True
    assert cfg.model.policies == {"default": Thresholds(review=0.2, block=0.8)}
    assert cfg.kafka.sasl_password is None


def test_default_client_id_names_the_host_and_process() -> None:
    assert load_config().kafka.client_id == f"trt-worker-{socket.gethostname()}-{os.getpid()}"


# --- sources and precedence ---------------------------------------------------------------------


def test_env_overrides_with_prefix_and_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_BATCH__MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("KTW_KAFKA__GROUP_ID", "replay-1")
    monkeypatch.setenv("KTW_MODEL__JPEG_ROUNDTRIP", "false")
    monkeypatch.setenv("KTW_LOG__LEVEL", "DEBUG")
    cfg = load_config()
    assert cfg.batch.max_batch_size == 32
    assert cfg.kafka.group_id == "replay-1"
    assert cfg.model.jpeg_roundtrip is False
    assert cfg.log.level == "DEBUG"


def test_env_dict_field_accepts_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_KAFKA__EXTRA", '{"socket.keepalive.enable": "true"}')
    assert load_config().kafka.extra == {"socket.keepalive.enable": "true"}


def test_a_model_sections_list_and_the_whole_section_accept_json_from_env(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model section is an extra key of ``moderation``, which pydantic-settings does not
    JSON-decode: a list there arrived as a string and was refused, named as if it were
    moderation's own field."""
    monkeypatch.setenv("KTW_MODERATION__TEXT__BATCH_SIZES", "[1, 8]")
    monkeypatch.setenv("KTW_MODERATION__CLIP", '{"token_buckets": [16, 77]}')
    cfg = load_config()
    assert cfg.moderation.sections["text"].batch_sizes == [1, 8]  # type: ignore[attr-defined]
    assert cfg.moderation.sections["clip"].token_buckets == [16, 77]  # type: ignore[attr-defined]
    monkeypatch.setenv("KTW_MODERATION__TEXT__BATCH_SIZES", "[0, 8]")
    with pytest.raises(ConfigError, match=r"text: .*batch_sizes must be strictly increasing"):
        load_config()
    monkeypatch.setenv("KTW_MODERATION__TEXT__BATCH_SIZES", "eight")
    with pytest.raises(ConfigError, match=r"text\.batch_sizes: Input should be a valid list"):
        load_config()


def test_unprefixed_env_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH__MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("MAX_BATCH_SIZE", "32")
    assert load_config().batch.max_batch_size == 16


def test_toml_file_is_read(tmp_path: Path) -> None:
    path = _toml(tmp_path, """
[kafka]
bootstrap_servers = "file-broker:9092"
[batch]
max_batch_size = 8
max_delay_ms = 5.0
[topics]
jobs = "frames.in"
""")
    cfg = load_config(path)
    assert cfg.kafka.bootstrap_servers == "file-broker:9092"
    assert cfg.batch.max_batch_size == 8
    assert cfg.batch.max_delay_ms == 5.0
    assert cfg.topics.jobs == "frames.in"
    assert cfg.topics.results == "moderation.results"  # untouched keys keep their defaults


def test_toml_path_may_be_a_string(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[batch]\nmax_batch_size = 8\n")
    assert load_config(str(path)).batch.max_batch_size == 8


def test_config_file_env_var_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KTW_CONFIG_FILE", str(_toml(tmp_path, "[batch]\nmax_batch_size = 8\n")))
    assert load_config().batch.max_batch_size == 8


def test_explicit_path_beats_the_config_file_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    from_env = _toml(tmp_path / "a", "[batch]\nmax_batch_size = 8\n")
    monkeypatch.setenv("KTW_CONFIG_FILE", str(from_env))
    explicit = _toml(tmp_path / "b", "[batch]\nmax_batch_size = 4\n")
    assert load_config(explicit).batch.max_batch_size == 4


def test_env_beats_file_and_explicit_overrides_beat_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, """
[batch]
max_batch_size = 8
max_delay_ms = 5.0
max_in_flight_batches = 3
""")
    monkeypatch.setenv("KTW_BATCH__MAX_BATCH_SIZE", "32")
    monkeypatch.setenv("KTW_BATCH__MAX_DELAY_MS", "7.5")
    cfg = load_config(path)
    assert (cfg.batch.max_batch_size, cfg.batch.max_delay_ms) == (32, 7.5)
    assert cfg.batch.max_in_flight_batches == 3  # only in the file
    cfg = load_config(path, batch={"max_batch_size": 4})
    assert cfg.batch.max_batch_size == 4  # explicit beats env
    assert cfg.batch.max_delay_ms == 7.5  # env still beats file for the other key
    assert cfg.batch.max_in_flight_batches == 3  # and the file still fills the rest


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_malformed_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid configuration"):
        load_config(_toml(tmp_path, "[batch\nmax_batch_size = = 3\n"))


def test_unknown_keys_in_the_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"batch\.max_batch_sise"):
        load_config(_toml(tmp_path, "[batch]\nmax_batch_sise = 3\n"))


def test_unknown_nested_env_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_BATCH__MAX_BATCH_SISE", "3")
    with pytest.raises(ConfigError, match="KTW_BATCH__MAX_BATCH_SISE"):
        load_config()


# --- KAFKA_BOOTSTRAP_SERVERS fallback -----------------------------------------------------------


def test_kafka_bootstrap_servers_is_used_when_nothing_else_names_brokers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    assert load_config().kafka.bootstrap_servers == "fallback:9092"


def test_ktw_env_beats_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    monkeypatch.setenv("KTW_KAFKA__BOOTSTRAP_SERVERS", "ktw:9092")
    assert load_config().kafka.bootstrap_servers == "ktw:9092"


def test_file_beats_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    path = _toml(tmp_path, '[kafka]\nbootstrap_servers = "file:9092"\n')
    assert load_config(path).kafka.bootstrap_servers == "file:9092"


def test_explicit_override_beats_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    cfg = load_config(kafka={"bootstrap_servers": "cli:9092"})
    assert cfg.kafka.bootstrap_servers == "cli:9092"


def test_fallback_keeps_the_other_kafka_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "fallback:9092")
    monkeypatch.setenv("KTW_KAFKA__GROUP_ID", "g2")
    cfg = load_config()
    assert (cfg.kafka.bootstrap_servers, cfg.kafka.group_id) == ("fallback:9092", "g2")


# --- validation messages ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "value", "field"),
    [
        ("KTW_BATCH__MAX_BATCH_SIZE", "0", "batch.max_batch_size"),
        ("KTW_BATCH__MAX_BATCH_SIZE", "many", "batch.max_batch_size"),
        ("KTW_BATCH__MAX_DELAY_MS", "-1", "batch.max_delay_ms"),
        ("KTW_KAFKA__SESSION_TIMEOUT_MS", "10", "kafka.session_timeout_ms"),
        ("KTW_KAFKA__SECURITY_PROTOCOL", "TLS", "kafka.security_protocol"),
        ("KTW_LIMITS__MAX_IMAGE_BYTES", str(65 * 1024 * 1024), "limits.max_image_bytes"),
        ("KTW_LIMITS__MAX_TEXT_CHARS", "100001", "limits.max_text_chars"),
        ("KTW_LOG__LEVEL", "LOUD", "log.level"),
        ("KTW_MODEL__BACKEND", "tensorflow", "model.backend"),
        ("KTW_COMMIT__DRAIN_TIMEOUT_S", "0", "commit.drain_timeout_s"),
    ],
)
def test_bad_value_names_the_field_and_the_env_var(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, field: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_config()
    message = str(info.value)
    assert field in message
    assert env in message


def test_shutdown_timeout_must_leave_room_for_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_COMMIT__SHUTDOWN_TIMEOUT_S", "30")  # drain_timeout_s is 30
    with pytest.raises(ConfigError, match="shutdown_timeout_s must exceed drain_timeout_s"):
        load_config()
    monkeypatch.setenv("KTW_COMMIT__SHUTDOWN_TIMEOUT_S", "31")
    assert load_config().commit.shutdown_timeout_s == 31


def test_every_bad_value_is_listed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_BATCH__MAX_BATCH_SIZE", "0")
    monkeypatch.setenv("KTW_LOG__LEVEL", "LOUD")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert "KTW_BATCH__MAX_BATCH_SIZE" in str(info.value)
    assert "KTW_LOG__LEVEL" in str(info.value)


def test_bad_value_in_the_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"batch\.max_batch_size"):
        load_config(_toml(tmp_path, "[batch]\nmax_batch_size = 0\n"))


def test_bad_explicit_override_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"batch\.max_batch_size"):
        load_config(batch={"max_batch_size": -3})


def test_config_error_is_fatal_and_chains_the_validation_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KTW_BATCH__MAX_BATCH_SIZE", "0")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert info.value.recoverable is False
    assert isinstance(info.value.__cause__, pydantic.ValidationError)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        ({"low_watermark": 512, "high_watermark": 512}, "low_watermark must be below"),
        ({"low_watermark": 600, "high_watermark": 512}, "low_watermark must be below"),
        ({"max_batch_size": 64, "high_watermark": 32, "low_watermark": 8},
         "high_watermark must be at least max_batch_size"),
    ],
)
def test_watermarks_must_be_ordered(batch: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        load_config(batch=batch)
    assert "KTW_BATCH" in str(info.value)


def test_watermarks_in_order_are_accepted() -> None:
    cfg = load_config(batch={"max_batch_size": 32, "high_watermark": 32, "low_watermark": 31})
    assert (cfg.batch.low_watermark, cfg.batch.high_watermark) == (31, 32)


def test_review_threshold_above_block_is_refused() -> None:
    with pytest.raises(ConfigError, match="review threshold must not exceed block") as info:
        load_config(model={"policies": {"loose": {"review": 0.9, "block": 0.5}}})
    assert "model.policies.loose" in str(info.value)
    assert "KTW_MODEL__POLICIES__LOOSE" in str(info.value)


def test_equal_thresholds_are_accepted() -> None:
    cfg = load_config(model={"policies": {"binary": {"review": 0.5, "block": 0.5}}})
    assert cfg.model.policies["binary"] == Thresholds(review=0.5, block=0.5)


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_thresholds_outside_zero_one_are_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("KTW_MODEL__POLICIES__DEFAULT__BLOCK", value)
    with pytest.raises(ConfigError, match="KTW_MODEL__POLICIES__DEFAULT__BLOCK"):
        load_config()


@pytest.mark.parametrize(
    "topics",
    [
        {"jobs": "t", "results": "t"},
        {"results": "moderation.dlq"},
        {"jobs": "x", "results": "x", "dlq": "x"},
    ],
)
def test_topics_must_be_distinct(topics: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="three different topics"):
        load_config(topics=topics)


def test_empty_topic_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_TOPICS__DLQ", "")
    with pytest.raises(ConfigError, match="KTW_TOPICS__DLQ"):
        load_config()


# --- secrets ------------------------------------------------------------------------------------


def test_sasl_password_is_loaded_but_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KTW_KAFKA__SASL_USERNAME", "svc-moderation")
    monkeypatch.setenv("KTW_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    cfg = load_config()
    assert cfg.kafka.sasl_password is not None
    assert cfg.kafka.sasl_password.get_secret_value() == SECRET
    for text in (repr(cfg), str(cfg), cfg.model_dump_json(), repr(cfg.kafka), str(cfg.kafka),
                 repr(cfg.model_dump()), f"{cfg}", f"{cfg!r}"):
        assert SECRET not in text
    assert "svc-moderation" in repr(cfg)  # the check above is not vacuous: fields are printed


def test_sasl_password_from_the_file_is_not_printed(tmp_path: Path) -> None:
    path = _toml(tmp_path, f'[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_password = "{SECRET}"\n')
    cfg = load_config(path)
    assert cfg.kafka.sasl_password is not None
    assert cfg.kafka.sasl_password.get_secret_value() == SECRET
    assert SECRET not in repr(cfg) and SECRET not in cfg.model_dump_json()


def test_config_error_does_not_echo_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_KAFKA__SASL_PASSWORD", SECRET)
    monkeypatch.setenv("KTW_KAFKA__SESSION_TIMEOUT_MS", "1")
    with pytest.raises(ConfigError) as info:
        load_config()
    assert SECRET not in str(info.value)


def test_malformed_env_json_error_does_not_echo_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KTW_KAFKA", '{"sasl_password": "' + SECRET + '", ')
    with pytest.raises(ConfigError) as info:
        load_config()
    assert SECRET not in str(info.value)


# --- immutability -------------------------------------------------------------------------------


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cfg.batch = cfg.batch  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cfg.batch.max_batch_size = 1  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        cfg.model.policies["default"].block = 0.1  # type: ignore[misc]
    assert cfg.batch.max_batch_size == 16


def test_configs_from_the_same_sources_are_equal() -> None:
    assert load_config(kafka={"client_id": "c"}) == load_config(kafka={"client_id": "c"})


# --- policies -----------------------------------------------------------------------------------


def test_user_policy_merges_with_the_built_in_default() -> None:
    cfg = load_config(model={"policies": {"strict": {"review": 0.05, "block": 0.3}}})
    assert cfg.model.policies == {
        "default": Thresholds(review=0.2, block=0.8),
        "strict": Thresholds(review=0.05, block=0.3),
    }


def test_user_can_override_the_default_policy() -> None:
    cfg = load_config(model={"policies": {"default": {"review": 0.1, "block": 0.5}}})
    assert cfg.model.policies == {"default": Thresholds(review=0.1, block=0.5)}


def test_partial_policy_fills_the_missing_threshold() -> None:
    cfg = load_config(model={"policies": {"kids": {"review": 0.01}}})
    assert cfg.model.policies["kids"] == Thresholds(review=0.01, block=0.8)


def test_policies_from_env_merge_with_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KTW_MODEL__POLICIES__STRICT__REVIEW", "0.1")
    cfg = load_config()
    assert set(cfg.model.policies) == {"default", "strict"}
    assert cfg.model.policies["strict"].review == 0.1


def test_policies_from_file_and_env_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _toml(tmp_path, "[model.policies.ads]\nreview = 0.3\nblock = 0.6\n")
    monkeypatch.setenv("KTW_MODEL__POLICIES__KIDS__BLOCK", "0.4")
    cfg = load_config(path)
    assert set(cfg.model.policies) == {"default", "ads", "kids"}
    assert cfg.model.policies["ads"] == Thresholds(review=0.3, block=0.6)
    assert cfg.model.policies["kids"] == Thresholds(review=0.2, block=0.4)
