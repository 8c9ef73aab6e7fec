"""WEIR_TRANSACTIONS: one transaction per worker by default, per partition on request, nothing else; the worker id;
WEIR_STATIC_MEMBERSHIP."""

from __future__ import annotations

import socket

import pytest

from weir.app import engine
from weir.app.settings import load_settings


def test_one_transaction_per_worker_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WEIR_TRANSACTIONS", "WEIR_WORKER_ID", "WEIR_TRANSACTION_TIMEOUT_MS"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert (settings.transactions, settings.worker_id, settings.transaction_timeout_ms) == ("per_worker", "", 10_000)


def test_per_partition_and_a_stable_worker_id_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_TRANSACTIONS", "per_partition")
    monkeypatch.setenv("WEIR_WORKER_ID", "kitchen-1")
    monkeypatch.setenv("WEIR_TRANSACTION_TIMEOUT_MS", "30000")
    settings = load_settings()
    assert (settings.transactions, settings.worker_id, settings.transaction_timeout_ms) == ("per_partition", "kitchen-1", 30_000)


def test_an_unknown_transaction_layout_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_TRANSACTIONS", "per_batch")
    with pytest.raises(ValueError, match="WEIR_TRANSACTIONS='per_batch'"):
        load_settings()


def test_the_default_worker_id_is_the_host_and_web_port() -> None:
    # unique among live workers (one port per listener on a host), the same for a worker restarted in place
    assert engine.worker_slot(6067) == f"{socket.gethostname()}-6067"
    assert engine.worker_slot(6067) != engine.worker_slot(6068)


@pytest.mark.parametrize(("raw", "expected"), [("", True), ("1", True), ("true", True), ("0", False), ("off", False)])
def test_static_membership_is_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("WEIR_STATIC_MEMBERSHIP", raw)
    assert load_settings().static_membership is expected


def test_a_static_membership_setting_that_is_not_a_boolean_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_STATIC_MEMBERSHIP", "sometimes")
    with pytest.raises(ValueError, match="WEIR_STATIC_MEMBERSHIP='sometimes'"):
        load_settings()
