"""The item step (app.pipeline.make_step): async steps and, with WEIR_ITEM_THREADS, sync steps run a message's items at once.

"At once" is shown by a barrier of ten parties that each item waits at: items run one after the other never
get past it (its timeout breaks it, and the item fails).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from app.pipeline import make_step


def meeting_sync(barrier: threading.Barrier) -> Any:
    def step(payload: Any) -> dict[str, Any]:
        barrier.wait()
        return {"value": payload, "thread": threading.current_thread().name}

    return step


async def run_ten(step: Any) -> list[Any]:
    return list(await asyncio.gather(*(step(index, index, {}) for index in range(10))))


def test_a_sync_step_in_a_pool_runs_ten_items_at_once_off_the_event_loop() -> None:
    step, at_once = make_step(meeting_sync(threading.Barrier(10, timeout=10)), threads=10)
    assert at_once
    outcomes = asyncio.run(run_ten(step))
    assert [outcome.error for outcome in outcomes] == [None] * 10, "the ten items met at the barrier: they ran at once"
    assert [outcome.value["value"] for outcome in outcomes] == list(range(10))
    assert all(outcome.value["thread"].startswith("weir-item-step") for outcome in outcomes)


def test_a_sync_step_without_threads_runs_in_the_loop_in_turn() -> None:
    step, at_once = make_step(lambda payload: {"value": payload, "thread": threading.current_thread().name}, threads=0)
    assert not at_once
    outcomes = asyncio.run(run_ten(step))
    assert {outcome.value["thread"] for outcome in outcomes} == {threading.main_thread().name}


@pytest.mark.parametrize("threads", [0, 4])
def test_an_async_step_runs_ten_items_at_once_whatever_the_threads(threads: int) -> None:
    async def run() -> list[Any]:
        barrier = asyncio.Barrier(10)

        async def meeting(payload: Any) -> Any:
            await asyncio.wait_for(barrier.wait(), timeout=10)
            return payload

        step, at_once = make_step(meeting, threads=threads)
        assert at_once
        return await run_ten(step)

    outcomes = asyncio.run(run())
    assert [outcome.value for outcome in outcomes] == list(range(10))


def test_a_failing_sync_step_in_a_pool_is_retried_and_reported() -> None:
    calls: list[int] = []

    def flaky(payload: Any) -> Any:
        calls.append(payload)
        raise ValueError("no")

    step, _ = make_step(flaky, threads=2)
    outcome = asyncio.run(step(7, 0, {}))
    assert not outcome.ok
    assert "ValueError: no" in (outcome.error or "")
    assert len(calls) == outcome.attempts >= 2
