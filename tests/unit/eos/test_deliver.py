"""The consumer's fast delivery path: a conductor callback is run by hand and, only if it waits, goes on as a task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mode import Service

from weir.app.engine import delivery


async def _deliver(callback: Any, suspend: asyncio.Event) -> bool:
    """``WeirConsumer._deliver`` on a stand-in consumer: a mode Service (its real ``wait_first``) with a ``suspend_flow``."""

    class Consumer(Service):
        suspend_flow = suspend

    return await delivery.WeirConsumer._deliver(Consumer(), callback)  # type: ignore[arg-type]


def test_a_callback_that_never_waits_is_delivered_without_a_task() -> None:
    asyncio.run(_test_a_callback_that_never_waits_is_delivered_without_a_task())


async def _test_a_callback_that_never_waits_is_delivered_without_a_task() -> None:
    seen: list[int] = []

    async def callback() -> None:
        seen.append(1)

    before = len(asyncio.all_tasks())
    assert await _deliver(callback(), asyncio.Event())
    assert seen == [1]
    assert len(asyncio.all_tasks()) == before


def test_a_callback_that_waits_goes_on_where_it_stopped_and_gets_what_it_awaited() -> None:
    asyncio.run(_test_a_callback_that_waits_goes_on_where_it_stopped_and_gets_what_it_awaited())


async def _test_a_callback_that_waits_goes_on_where_it_stopped_and_gets_what_it_awaited() -> None:
    steps: list[Any] = []
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def callback() -> None:
        steps.append("start")
        steps.append(await future)
        await asyncio.sleep(0)
        steps.append("end")

    asyncio.get_running_loop().call_later(0.01, future.set_result, "value")
    assert await _deliver(callback(), asyncio.Event())
    assert steps == ["start", "value", "end"], "each step ran once, in order, with the awaited result"


def test_an_exception_after_the_first_wait_reaches_the_caller() -> None:
    asyncio.run(_test_an_exception_after_the_first_wait_reaches_the_caller())


async def _test_an_exception_after_the_first_wait_reaches_the_caller() -> None:
    async def callback() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await _deliver(callback(), asyncio.Event())


def test_a_suspended_flow_stops_a_waiting_delivery_and_cancels_it() -> None:
    asyncio.run(_test_a_suspended_flow_stops_a_waiting_delivery_and_cancels_it())


async def _test_a_suspended_flow_stops_a_waiting_delivery_and_cancels_it() -> None:
    suspend = asyncio.Event()
    cancelled: list[bool] = []
    blocker: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def callback() -> None:
        try:
            await blocker
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    asyncio.get_running_loop().call_later(0.01, suspend.set)
    assert not await _deliver(callback(), suspend)
    await asyncio.sleep(0.01)
    assert cancelled == [True], "the cancel went into the callback, where it was waiting"
