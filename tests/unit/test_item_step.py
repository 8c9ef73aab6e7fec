"""The item step (app.pipeline.make_step): async steps, and sync steps once they block, run a message's items at once.

"At once" is shown by a barrier of ten parties that each item waits at: items run one after the other never
get past it (its timeout breaks it, and the item fails).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest

from weir.app.pipeline import make_step


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


class _Flaky:
    """A sync step that raises its first ``failures`` calls for each payload, then doubles it."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[Any, int] = {}

    def __call__(self, payload: Any) -> Any:
        self.calls[payload] = self.calls.get(payload, 0) + 1
        if self.calls[payload] <= self.failures:
            raise ValueError(f"call {self.calls[payload]} of {payload!r}")
        return payload * 2


def _outcomes(function: _Flaky, payloads: list[int]) -> list[Any]:
    """The item worker's outcomes for one item message, its step tried in place first (as the pipeline's sync step is)."""
    from weir.app.aggregation import ItemWorker

    async def step(payload: Any, index: int, message: dict[str, Any]) -> Any:
        raise AssertionError("a sync step in place is not run through the coroutine step")

    worker = ItemWorker(agent="items", step=step, results=None, concurrent=False, concurrency=1, in_place=function)  # type: ignore[arg-type]
    message = {
        "kind": "items",
        "correlation_id": "o-1",
        "total": len(payloads),
        "items": [{"index": index, "last": index == len(payloads) - 1, "payload": payload} for index, payload in enumerate(payloads)],
    }

    async def run() -> Any:
        return await worker.outcomes(None, message)  # type: ignore[arg-type]

    _, outcome_message = asyncio.run(run())
    return list(outcome_message["items"]) if outcome_message["kind"] == "items" else [outcome_message]


def test_a_sync_step_tried_in_place_gives_each_items_result_with_one_attempt() -> None:
    function = _Flaky(failures=0)
    items = _outcomes(function, [1, 2, 3])
    assert [(item["ok"], item["result"], item["attempts"]) for item in items] == [(True, 2, 1), (True, 4, 1), (True, 6, 1)]
    assert function.calls == {1: 1, 2: 1, 3: 1}


def test_a_sync_step_tried_in_place_that_raises_is_retried_by_the_policy_from_its_second_attempt() -> None:
    from weir import Settings, TestDriver

    settings = Settings(partitions=1, retry_attempts=3, retry_backoff_ms=1, retry_max_backoff_ms=1)
    once, always = _Flaky(failures=1), _Flaky(failures=99)
    with TestDriver(settings=settings, item_step=once) as driver:
        driver.pipe("orders", {"order_id": "o-1", "items": [5]}, key="o-1")
        [result] = driver.values("aggregates")
        assert [(item["status"], item["result"]) for item in result["items"]] == [("ok", 10)]
        assert driver.dead_letters() == []
    assert once.calls == {5: 2}
    with TestDriver(settings=settings, item_step=always) as driver:
        driver.pipe("orders", {"order_id": "o-2", "items": [7]}, key="o-2")
        [result] = driver.values("aggregates")
        [item] = result["items"]
        assert (item["status"], item["error"]) == ("failed", "ValueError: call 3 of 7")
        assert [(letter["reason"], letter["attempts"]) for letter in driver.dead_letters()] == [("failed", 3)], "dead-lettered alone"
    assert always.calls == {7: 3}, "the policy's three attempts in all, the first in place"


def _message(payloads: list[Any], correlation_id: str = "o-1") -> dict[str, Any]:
    return {
        "kind": "items",
        "correlation_id": correlation_id,
        "total": len(payloads),
        "items": [{"index": index, "last": index == len(payloads) - 1, "payload": payload} for index, payload in enumerate(payloads)],
    }


def test_a_sync_step_that_blocks_moves_to_the_pool_and_the_rest_of_the_order_runs_at_once() -> None:
    """Seed 003's "ten items of one second in about one second", by default: the first two calls block the event loop;
    the order's eight other items then meet at a barrier of eight in the pool, and every later order's ten."""
    from weir.app.aggregation import ItemWorker

    rest = threading.Barrier(8, timeout=10)
    later = threading.Barrier(10, timeout=10)
    threads: list[str] = []

    def step(payload: Any) -> Any:
        threads.append(threading.current_thread().name)
        if payload in (("o-1", 0), ("o-1", 1)):
            time.sleep(0.05)  # blocks: over the 20 ms of WEIR_ITEM_BLOCKING_MS, twice in a row
        else:
            (rest if payload[0] == "o-1" else later).wait()
        return payload[1]

    pooled, _ = make_step(step, threads=16)
    worker = ItemWorker(agent="items", step=pooled, results=None, concurrent=False, concurrency=100, in_place=step, blocking_s=0.02)  # type: ignore[arg-type]

    async def run(correlation_id: str) -> list[Any]:
        _, outcomes = await worker.outcomes(None, _message([(correlation_id, index) for index in range(10)], correlation_id))  # type: ignore[arg-type]
        return [(item["ok"], item["result"]) for item in outcomes["items"]]

    assert asyncio.run(run("o-1")) == [(True, index) for index in range(10)], "the eight after the first two met at once"
    assert threads[:2] == [threading.main_thread().name] * 2
    assert all(name.startswith("weir-item-step") for name in threads[2:])
    assert worker.concurrent
    assert asyncio.run(run("o-2")) == [(True, index) for index in range(10)], "a later order's ten met at once"


@pytest.mark.parametrize(("slow_every", "orders"), [(None, 20), (7, 3)], ids=["never-slow", "one-slow-call-in-seven"])
def test_a_short_sync_step_stays_in_the_event_loop(slow_every: int | None, orders: int) -> None:
    """A short step stays in the event loop, also when one call of it is slow now and then, never two in a row (a
    garbage collection or a descheduled process): one such call moved it to the pool for the worker's life, where it
    cost twice the CPU per order."""
    from weir.app.aggregation import ItemWorker

    threads: set[str] = set()
    calls = itertools.count()

    def step(payload: Any) -> Any:
        threads.add(threading.current_thread().name)
        if slow_every is not None and next(calls) % slow_every == 3:
            time.sleep(0.03)  # over the 20 ms of blocking_s, once
        return payload

    pooled, _ = make_step(step, threads=16)
    worker = ItemWorker(agent="items", step=pooled, results=None, concurrent=False, concurrency=100, in_place=step, blocking_s=0.02)  # type: ignore[arg-type]
    for number in range(orders):
        asyncio.run(worker.outcomes(None, _message(list(range(10)), f"o-{number}")))  # type: ignore[arg-type]
    assert threads == {threading.main_thread().name}
    assert not worker.concurrent


def test_by_default_an_orders_blocking_items_run_at_once_on_the_driver() -> None:
    """The pipeline as a worker runs it, with weir's default settings but one partition: no WEIR_ITEM_THREADS to set."""
    from weir import Settings, TestDriver

    settings = Settings(partitions=1)
    assert settings.item_threads > 0
    assert settings.item_blocking_ms > 0
    meet = threading.Barrier(8, timeout=10)

    def step(payload: Any) -> Any:
        if payload in (0, 1):
            time.sleep(0.05)
        else:
            meet.wait()
        return payload * 10

    with TestDriver(settings=settings, item_step=step) as driver:
        driver.pipe("orders", {"order_id": "o-1", "items": list(range(10))}, key="o-1")
        [result] = driver.values("aggregates")
    assert [(item["status"], item["result"]) for item in result["items"]] == [("ok", index * 10) for index in range(10)]


def test_a_short_step_that_fails_once_stays_in_the_event_loop() -> None:
    """The retry's backoff is not the step blocking: only the call itself is timed."""
    from weir.app.aggregation import ItemWorker
    from weir.app.errors import RetryPolicy

    calls: list[Any] = []

    def step(payload: Any) -> Any:
        calls.append(payload)
        if len(calls) == 1:
            raise RuntimeError("once")
        return payload

    pooled, _ = make_step(step, threads=16)
    policy = RetryPolicy(attempts=3, backoff_ms=100, max_backoff_ms=100)
    worker = ItemWorker(
        agent="items", step=pooled, results=None, concurrent=False, concurrency=100, in_place=step, policy=policy, blocking_s=0.02
    )  # type: ignore[arg-type]
    asyncio.run(worker.outcomes(None, _message([1, 2, 3])))  # type: ignore[arg-type]
    assert not worker.concurrent
    assert worker.in_place is step
