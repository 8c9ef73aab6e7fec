"""WEIR_FETCH_MAX_WAIT_MS: how long the broker may hold a worker's fetch, read and given to the worker's consumer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weir.app import engine
from weir.app.application import Application
from weir.app.engine.config import installed
from weir.app.settings import Settings, load_settings


def test_the_fetch_wait_is_100_ms_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEIR_FETCH_MAX_WAIT_MS", raising=False)
    assert load_settings().fetch_max_wait_ms == 100
    monkeypatch.setenv("WEIR_FETCH_MAX_WAIT_MS", "500")
    assert load_settings().fetch_max_wait_ms == 500


def test_a_negative_fetch_wait_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_FETCH_MAX_WAIT_MS", "-1")
    with pytest.raises(ValueError, match="WEIR_FETCH_MAX_WAIT_MS"):
        load_settings()


@pytest.mark.parametrize("wait_ms", [0, 42, 1_500])
def test_the_worker_consumer_waits_as_long_as_set(wait_ms: int) -> None:
    """Faust builds the consumer with 1,500 ms whatever it is told; weir's consumer thread gives it the setting."""
    before = installed()
    application = Application(Settings(app_id=f"unit-fetch-wait-{wait_ms}", fetch_max_wait_ms=wait_ms))
    try:

        async def created_wait_ms() -> Any:
            consumer = application.app.consumer._thread._create_worker_consumer(application.app.transport)
            await consumer.stop()  # never started: closes its client
            return consumer._fetch_max_wait_ms

        assert asyncio.run(created_wait_ms()) == wait_ms
    finally:
        engine.install(before)
