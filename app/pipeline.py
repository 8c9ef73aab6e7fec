"""The split/aggregate pipeline (seed 003) with one item step, compiled into its stages: splitter, items, aggregator.

:class:`PipelineTopology` takes the item step (a function of an item's payload, sync or async) and a
:class:`app.stages.Wiring`. A worker serves its stages (``agents/splitter.py``, ``agents/items.py``,
``agents/aggregator.py``, with the step ``WEIR_ITEM_PROCESSOR`` names); the test driver runs them in process. With
``inline`` (``WEIR_ITEMS_INLINE``) the splitter runs the step on an order's items itself and sends the order's result:
one hop instead of three, for a cheap step.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from faust.types import EventT

from weir.app.aggregation import (
    Aggregation,
    ItemWorker,
    Keyed,
    aggregate_inline,
    encode_split,
    invalid_result,
    send_result,
    send_splits,
    split_messages,
)
from weir.app.errors import RetryPolicy, StepOutcome, run_with_retry
from weir.app.runtime.keyed import Output, send_checked
from weir.app.settings import Settings, load_named
from weir.app.shell import handle_part_events, now_ms
from weir.app.split import split_order
from weir.app.stages import Stage, Wiring, per_event
from weir.tables.aggregates import AggregatorConfig

__all__ = ["as_is", "load_processor", "make_step", "aggregator_config", "PipelineTopology", "AGGREGATOR_NAME"]

#: The item step on one item: (payload, its index, the item message) -> its outcome (``app.aggregation.ItemStep``).
ItemStep = Callable[[Any, int, dict[str, Any]], Awaitable[StepOutcome]]

#: The pipeline's aggregator, by its name in the results.
AGGREGATOR_NAME = "order-items"


def as_is(payload: Any) -> Any:
    """The default item step: an item's result is its payload (a split and an aggregate with nothing in between)."""
    return payload


def load_processor(spec: str) -> Callable[[Any], Any]:
    """Import the item step named ``module:function``."""
    function: Callable[[Any], Any] = load_named("WEIR_ITEM_PROCESSOR", spec, "a callable", callable)
    return function


def aggregator_config(settings: Settings) -> AggregatorConfig:
    """The pipeline's aggregator: its name in the results, its timeouts, how long a completed group is remembered."""
    return AggregatorConfig(
        name=AGGREGATOR_NAME,
        timeout_ms=settings.aggregate_timeout_ms or None,
        inactivity_ms=settings.aggregate_inactivity_ms or None,
        done_retention_ms=settings.done_retention_ms,
        rerequest_after_ms=settings.aggregate_rerequest_ms or None,
        rerequests=settings.aggregate_rerequests,
    )


def make_step(process: Callable[[Any], Any], *, threads: int, policy: RetryPolicy | None = None) -> tuple[ItemStep, bool]:
    """The item step on one item, retried by ``policy`` (``app.aggregation.ItemStep``; default: the settings'
    defaults), and whether a message's items may run at once.

    An async ``process`` runs in the event loop, its items at once (it may wait on I/O). A sync one runs in
    the event loop, one item after the other, when ``threads`` is 0 (the cheapest for a short step: no
    hand-off); else in a pool of ``threads`` threads, its items at once, so that a slow or blocking sync step
    neither serialises a message's items nor stalls the worker's event loop (heartbeats, commits). The
    pipeline's items stage tries a sync step in place first and takes this pool once a call blocked
    (``WEIR_ITEM_BLOCKING_MS``, :class:`app.aggregation.ItemWorker`).
    """
    retries = policy if policy is not None else Settings().retry_policy()
    if asyncio.iscoroutinefunction(process) or threads <= 0:
        runs_at_once = asyncio.iscoroutinefunction(process)

        async def inline(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
            return await run_with_retry(retries, lambda: process(payload))

        return inline, runs_at_once
    pool = ThreadPoolExecutor(threads, thread_name_prefix="weir-item-step")

    async def in_thread(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
        loop = asyncio.get_running_loop()
        # the step's thread sees the attempt (weir.attempt()): each attempt runs in a copy of this context
        return await run_with_retry(retries, lambda: loop.run_in_executor(pool, contextvars.copy_context().run, process, payload))

    return in_thread, True


class PipelineTopology:
    """The pipeline's topics (``orders``, ``items``, ``item-results``, ``aggregates``), its tables and three stages."""

    def __init__(self, process: Callable[[Any], Any], wiring: Wiring, *, inline: bool | None = None) -> None:
        settings = wiring.settings
        self.settings = settings
        self.inline = settings.items_inline if inline is None else inline
        if self.inline and settings.processing_guarantee != "exactly_once":
            raise RuntimeError(
                f"WEIR_ITEMS_INLINE=1 needs WEIR_GUARANTEE=exactly_once (got {settings.processing_guarantee!r}): an order's "
                "result is sent in the transaction that commits its offset, and nothing else remembers it; under "
                "at_least_once an order replayed after a crash would send its result again"
            )
        self._wiring = wiring
        self.orders = wiring.topic_named("orders")
        self.items = wiring.topic_named("items")
        self.item_results = wiring.topic_named("item-results")
        self.aggregates = wiring.topic_named("aggregates")
        self.config = aggregator_config(settings)
        self.policy = settings.retry_policy()
        self.step, self.runs_at_once = make_step(process, threads=settings.item_threads, policy=self.policy)
        sync = not asyncio.iscoroutinefunction(process)
        #: a sync step with a pool starts in the event loop and moves to the pool once a call blocks for longer than
        #: WEIR_ITEM_BLOCKING_MS (:class:`ItemWorker`); with WEIR_ITEM_BLOCKING_MS=0 it always runs in the pool
        self.adaptive = sync and settings.item_threads > 0 and settings.item_blocking_ms > 0
        #: the step's plain function when it runs in the event loop, one item after the other: an ItemWorker tries it
        #: in place first, and retries through ``step`` only when it raised
        self.in_place = process if sync and (settings.item_threads == 0 or self.adaptive) else None

    def _worker(self, agent: str, results: Any) -> ItemWorker:
        return ItemWorker(
            agent=agent,
            step=self.step,
            results=results,
            concurrent=self.runs_at_once and not self.adaptive,
            concurrency=self.settings.item_concurrency,
            bundle=self.settings.bundle,
            in_place=self.in_place,
            policy=self.policy,
            blocking_s=self.settings.item_blocking_ms / 1000 if self.adaptive else None,
        )

    @functools.cached_property
    def aggregation(self) -> Aggregation:
        """The aggregate stage and its tables (declared when a stage needs them: a splitter's worker declares none)."""
        table = self._wiring.table
        return Aggregation(
            agent="aggregator",
            config=self.config,
            open_groups=table(
                "aggregates",
                "Open split groups by correlation id: items received by index (ok/failed), expected count, deadline "
                "(value: tables.aggregates.GroupState).",
            ),
            done_groups=table(
                "aggregates_done",
                "Completed groups, kept for the done retention to count late items, which are never merged (value: "
                "tables.aggregates.DoneState).",
            ),
            deadlines=table(
                "aggregate_deadlines",
                "Deadline index of the aggregator (app.deadlines.DeadlineIndex): per partition, the entries "
                "[kind, correlation id] due in each second, and the first second not yet walked by the ticks.",
            ),
            outputs=lambda event, correlation_id, result, context: [Output(self.aggregates, correlation_id, result, what="the result")],
            items=self.items,
        )

    def stages(self) -> list[Stage]:
        if self.inline:
            return [self.splitter_stage()]
        return [self.splitter_stage(), self.items_stage(), self.aggregator_stage()]

    def splitter_stage(self) -> Stage:
        """Reads orders in batches; sends the item chunks of a batch's orders to the items topic, bundled.

        An order's 'open', when apart from its chunks, goes to the aggregator. Inline, the order's result goes to the
        aggregates topic instead. A bad order is dead-lettered alone, and still gets its one result, ``invalid``. An
        order's offset is committed with everything it sent.
        """
        agent = "splitter"

        async def owed(event: EventT[bytes], reason: str, error: str) -> None:
            """An order that cannot be split (or run inline) still gets its one result, ``invalid``, keyed by the order's key.

            Whoever waits for the order's result learns that it failed and why; the order itself is in the dead
            letters. An order without a key has nobody to answer: the dead letter is all there is.
            """
            if not event.message.key:
                return
            correlation_id = event.message.key.decode("utf-8", "replace")
            result = invalid_result(correlation_id, self.config.name, reason, error)
            await send_checked(event, [Output(self.aggregates, correlation_id, result, what="the result")], agent=agent, step="owed")

        async def split_part(part: Sequence[EventT[bytes]]) -> None:
            splits: list[tuple[list[Keyed], list[Keyed]]] = []

            async def split(event: EventT[bytes], order: Any) -> None:
                order_id, items = split_order(order)
                deadline_ms = self.config.deadline_from(now_ms())
                origin = f"{event.message.topic}:{event.message.partition}:{event.message.offset}"  # this order's record
                messages = split_messages(
                    order_id,
                    items,
                    chunk=self.settings.split_chunk,
                    deadline_ms=deadline_ms,
                    origin=origin,
                    payloads_in_open=self.config.rerequest_after_ms is not None,
                )
                splits.append(encode_split(order_id, *messages))

            await handle_part_events(part, agent=agent, what="splitter: order", handler=split, owed=owed)
            await send_splits(splits, results=self.item_results, items=self.items, size=self.settings.bundle)

        inline_worker = self._worker(agent, self.aggregates)

        async def inline_part(part: Sequence[EventT[bytes]]) -> None:
            async def aggregate(event: EventT[bytes], order: Any) -> None:
                order_id, items = split_order(order)
                result = await aggregate_inline(inline_worker, self.config, event, order_id, items)
                await send_result(event, [Output(self.aggregates, order_id, result, what="the result")], agent=agent)

            # Orders at once (a task each) only while the step may wait: an async step, or a sync one in the pool. A sync
            # step tried in place runs each order to its end anyway, and a task per order was 5% of the worker's CPU.
            concurrent = inline_worker.concurrent
            await handle_part_events(part, agent=agent, what="splitter: order", handler=aggregate, concurrent=concurrent, owed=owed)

        return Stage(agent, (self.orders,), inline_part if self.inline else split_part)

    def items_stage(self) -> Stage:
        """Runs the item step on every item of every item message, with retries; each message's outcomes go to the
        aggregator in one message, bundled by aggregator partition (``WEIR_BUNDLE``)."""
        worker = self._worker("items", self.item_results)

        async def handle_part(part: Sequence[EventT[bytes]]) -> None:
            await worker.handle_part(part, what="items: item")

        # a step that may move to its pool (adaptive) runs partitions' parts at once as a pooled step does: before the
        # move its sync calls do not yield, so the parts still run one after the other
        return Stage("items", (self.items,), handle_part, concurrent_parts=worker.concurrent or self.adaptive)

    def aggregator_stage(self) -> Stage:
        """Reads 'open', 'item', 'items' (a chunk's outcomes) and 'tick' messages keyed by correlation id; completes a
        group by count, last flag or timeout."""
        aggregation = self.aggregation
        handler = per_event(agent=aggregation.agent, what="aggregator: message", handler=aggregation.handle)
        return Stage("aggregator", (self.item_results,), handler, ticked=(self.item_results,))
