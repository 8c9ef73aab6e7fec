"""An error that escapes an agent's loop stops the worker (``app.core.worker_stops_on_escape``).

Faust's supervisor would restart the actor, and the batch it held would be neither handled nor delivered
again while the worker runs: the committed offsets would stop below it for good.
"""

from __future__ import annotations

import asyncio

import pytest

from weir.app import core
from weir.app.errors import OutputFailed


class Crashes(list[BaseException]):
    """What the worker was crashed with: the ``crash`` a worker passes (its Faust app's), recording instead."""

    async def __call__(self, reason: BaseException) -> None:
        self.append(reason)


@pytest.fixture
def crashes() -> Crashes:
    return Crashes()


def test_an_error_escaping_an_agent_s_loop_stops_the_worker(crashes: Crashes) -> None:
    async def run() -> None:
        with pytest.raises(OutputFailed):
            async with core.worker_stops_on_escape(crashes):
                raise OutputFailed("the result could not be queued")
        async with core.worker_stops_on_escape(crashes):
            pass  # a loop that ends (the worker stopping) stops nothing

    asyncio.run(run())
    assert [str(reason) for reason in crashes] == ["the result could not be queued"]


def test_a_worker_stopping_on_an_escaped_error_commits_nothing_more(crashes: Crashes) -> None:
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
            async with core.worker_stops_on_escape(crashes):
                raise OutputFailed("the result could not be queued")
        return await commit.commit_transactions(Manager(), {})

    assert gate.refused is None
    assert asyncio.run(run()) is False, "the commit on the way out is refused"
    assert gate.refused is not None
    assert "could not be queued" in gate.refused


def test_a_cancelled_agent_does_not_stop_the_worker(crashes: Crashes) -> None:
    async def run() -> None:
        with pytest.raises(asyncio.CancelledError):
            async with core.worker_stops_on_escape(crashes):
                raise asyncio.CancelledError

    asyncio.run(run())
    assert crashes == [], "a worker stopping cancels its agents: not an error"
