"""An error that escapes an agent's loop stops the worker (``app.core.worker_stops_on_escape``).

Faust's supervisor would restart the actor, and the batch it held would be neither handled nor delivered
again while the worker runs: the committed offsets would stop below it for good.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weir.app import core
from weir.app.errors import OutputFailed


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


def test_a_worker_stopping_on_an_escaped_error_commits_nothing_more(crashes: list[BaseException]) -> None:
    """The failed part's sends are in the open transaction without its offsets: Faust's stop must not commit them."""
    from weir.app.engine import commit, gate

    class Manager:
        def __init__(self) -> None:
            producer = type("P", (), {"buffer": type("B", (), {"flush": staticmethod(lambda: asyncio.sleep(0))})()})()
            self.app = type("A", (), {"producer": producer, "consumer_generation_id": 1})()

        def transactional_id_for(self, topic: str, partition: int) -> str:
            return "t"

    async def run() -> bool:
        with pytest.raises(OutputFailed):
            async with core.worker_stops_on_escape():
                raise OutputFailed("the result could not be queued")
        return await commit.commit_transactions(Manager(), {})

    assert gate.refused is None
    assert asyncio.run(run()) is False, "the commit on the way out is refused"
    assert gate.refused is not None
    assert "could not be queued" in gate.refused


def test_a_cancelled_agent_does_not_stop_the_worker(crashes: list[BaseException]) -> None:
    async def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            async with core.worker_stops_on_escape():
                raise asyncio.CancelledError

    asyncio.run(run())
    assert crashes == [], "a worker stopping cancels its agents: not an error"
