"""An error that escapes an agent's loop stops the worker (``app.core.worker_stops_on_escape``).

Faust's supervisor would restart the actor, and the batch it held would be neither handled nor delivered
again while the worker runs: the committed offsets would stop below it for good.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app import core
from app.errors import OutputFailed


@pytest.fixture
def crashes(monkeypatch: Any) -> list[BaseException]:
    """What the app was crashed with (its ``crash`` replaced by a recorder)."""
    reasons: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        reasons.append(reason)

    monkeypatch.setattr(core.app, "crash", crash)
    return reasons


def test_an_error_escaping_an_agent_s_loop_stops_the_worker(crashes: list[BaseException]) -> None:
    async def run() -> None:
        with pytest.raises(OutputFailed):
            async with core.worker_stops_on_escape():
                raise OutputFailed("the result could not be queued")
        async with core.worker_stops_on_escape():
            pass  # a loop that ends (the worker stopping) stops nothing

    asyncio.run(run())
    assert [str(reason) for reason in crashes] == ["the result could not be queued"]


def test_a_cancelled_agent_does_not_stop_the_worker(crashes: list[BaseException]) -> None:
    async def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            async with core.worker_stops_on_escape():
                raise asyncio.CancelledError

    asyncio.run(run())
    assert crashes == [], "a worker stopping cancels its agents: not an error"
