"""What more than one agent of the split/aggregate pipeline uses: the item step and the aggregator's config.

The item step is the user function ``WEIR_ITEM_PROCESSOR`` names, under the retry policy. Both live apart
from ``agents/`` so that the splitter can run the step and complete the order inline (``WEIR_ITEMS_INLINE``)
without declaring the items agent, or the aggregator's tables, in its process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.core import retry_policy, settings
from app.errors import StepOutcome, run_with_retry
from app.settings import load_named
from tables.aggregates import AggregatorConfig

__all__ = ["as_is", "load_processor", "make_step", "step", "STEP_IS_ASYNC", "STEP_RUNS_AT_ONCE", "STEP_IN_PLACE", "AGGREGATOR"]

#: The item step on one item: (payload, its index, the item message) -> its outcome (``app.aggregation.ItemStep``).
ItemStep = Callable[[Any, int, dict[str, Any]], Awaitable[StepOutcome]]

#: The pipeline's aggregator: its name in the results, its timeout, how long a completed group is remembered.
AGGREGATOR = AggregatorConfig(
    name="order-items",
    timeout_ms=settings.aggregate_timeout_ms or None,
    inactivity_ms=settings.aggregate_inactivity_ms or None,
    done_retention_ms=settings.done_retention_ms,
)


def as_is(payload: Any) -> Any:
    """The default item step: an item's result is its payload (a split and an aggregate with nothing in between)."""
    return payload


def load_processor(spec: str) -> Callable[[Any], Any]:
    """Import the item step named ``module:function``."""
    function: Callable[[Any], Any] = load_named("WEIR_ITEM_PROCESSOR", spec, "a callable", callable)
    return function


def make_step(process: Callable[[Any], Any], *, threads: int) -> tuple[ItemStep, bool]:
    """The item step on one item, retried by ``retry_policy`` (``app.aggregation.ItemStep``), and whether a
    message's items may run at once.

    An async ``process`` runs in the event loop, its items at once (it may wait on I/O). A sync one runs in
    the event loop, one item after the other, when ``threads`` is 0 (the cheapest for a short step: no
    hand-off); else in a pool of ``threads`` threads, its items at once, so that a slow or blocking sync step
    neither serialises a message's items nor stalls the worker's event loop (heartbeats, commits).
    """
    if asyncio.iscoroutinefunction(process) or threads <= 0:
        runs_at_once = asyncio.iscoroutinefunction(process)

        async def inline(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
            return await run_with_retry(retry_policy, lambda: process(payload))

        return inline, runs_at_once
    pool = ThreadPoolExecutor(threads, thread_name_prefix="weir-item-step")

    async def in_thread(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
        loop = asyncio.get_running_loop()
        return await run_with_retry(retry_policy, lambda: loop.run_in_executor(pool, process, payload))

    return in_thread, True


_process = load_processor(settings.item_processor)

#: an async step may wait on I/O: a batch's items then run at once (a sync step runs to the end anyway)
STEP_IS_ASYNC = asyncio.iscoroutinefunction(_process)
#: the item step (``WEIR_ITEM_PROCESSOR``), and whether a message's items run at once (async, or WEIR_ITEM_THREADS)
step, STEP_RUNS_AT_ONCE = make_step(_process, threads=settings.item_threads)
#: the item step's plain function when it runs in the event loop, one item after the other (sync, no threads): an
#: :class:`app.aggregation.ItemWorker` tries it in place first, and retries through ``step`` only when it raised
STEP_IN_PLACE = None if STEP_IS_ASYNC or settings.item_threads > 0 else _process
