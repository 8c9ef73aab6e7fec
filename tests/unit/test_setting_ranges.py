"""Settings are range-checked where the environment is read: a value no worker can run with is refused in one line
naming the setting (issue 37: WEIR_MAX_MESSAGE_BYTES=-1 was taken, and the worker crashed and never exited)."""

from __future__ import annotations

import pytest

from weir import SettingError, Settings


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("WEIR_MAX_MESSAGE_BYTES", "-1", "must be at least 16384"),
        ("WEIR_PARTITIONS", "0", "must be at least 1"),
        ("WEIR_WEB_PORT", "70000", "must be at most 65535"),
        ("WEIR_BATCH_SIZE", "0", "must be at least 1"),
        ("WEIR_TICK_INTERVAL_MS", "-5", "must be at least 1"),
        ("WEIR_COMMIT_INTERVAL", "nan", "expected a finite number"),
        ("WEIR_COMMIT_INTERVAL", "0", "must be at least 0.001"),
        ("WEIR_RETRY_ATTEMPTS", "0", "must be at least 1"),
        ("WEIR_REPLICATION_FACTOR", "0", "must be at least 1"),
        ("WEIR_MIN_INSYNC_REPLICAS", "0", "must be at least 1"),
    ],
)
def test_a_setting_out_of_range_is_refused_in_one_line_naming_it(monkeypatch: pytest.MonkeyPatch, name: str, raw: str, says: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=rf"^setting {name}={raw!r}: {says}$") as refused:
        Settings.from_env()
    assert "\n" not in str(refused.value)


def test_values_in_range_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_MAX_MESSAGE_BYTES", "16384")
    monkeypatch.setenv("WEIR_WEB_PORT", "0")
    monkeypatch.setenv("WEIR_ITEM_THREADS", "0")
    settings = Settings.from_env()
    assert (settings.max_message_bytes, settings.web_port, settings.item_threads) == (16_384, 0, 0)


def test_replication_settings_reach_every_topic_weir_creates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_REPLICATION_FACTOR", "3")
    monkeypatch.setenv("WEIR_MIN_INSYNC_REPLICAS", "2")
    settings = Settings.from_env()
    assert (settings.replication_factor, settings.topic_config()) == (3, {"min.insync.replicas": "2"})
    assert Settings().topic_config() == {"min.insync.replicas": "1"}  # the default: one broker's worth


def test_more_insync_replicas_than_copies_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_MIN_INSYNC_REPLICAS", "2")  # the factor stays 1: no write could ever succeed
    with pytest.raises(SettingError, match=r"^setting WEIR_MIN_INSYNC_REPLICAS=2: must be at most WEIR_REPLICATION_FACTOR \(1\)"):
        Settings.from_env()
    with pytest.raises(SettingError):
        Settings(replication_factor=2, min_insync_replicas=3)  # a value built in code is checked the same way
