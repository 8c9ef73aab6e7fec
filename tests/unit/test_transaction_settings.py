"""WEIR_TRANSACTIONS: one transaction per worker by default, per partition on request, nothing else."""

from __future__ import annotations

import pytest

from app.settings import load_settings


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
