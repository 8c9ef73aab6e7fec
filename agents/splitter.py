"""Splitter: an order of N items becomes item messages of up to ``split_chunk`` items each, then its offset commits.

With ``WEIR_ITEMS_INLINE`` it runs the item step on the order's items itself and sends the order's result
to the aggregates topic (``app.aggregation.aggregate_inline``): one hop instead of three, for a cheap step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faust.types import EventT, StreamT

from app.aggregation import ItemWorker, Keyed, aggregate_inline, encode_split, invalid_result, send_result, send_splits, split_messages
from app.core import app, handle_part_events, handle_parts, now_ms, settings, topics
from app.pipeline import AGGREGATOR, STEP_IN_PLACE, STEP_RUNS_AT_ONCE, step
from app.runtime.keyed import Output, send_checked
from app.split import split_order

__all__ = ["splitter"]

AGENT = "splitter"

if settings.items_inline and settings.processing_guarantee != "exactly_once":
    raise RuntimeError(
        f"WEIR_ITEMS_INLINE=1 needs WEIR_GUARANTEE=exactly_once (got {settings.processing_guarantee!r}): an order's result "
        "is sent in the transaction that commits its offset, and nothing else remembers it; under at_least_once an "
        "order replayed after a crash would send its result again"
    )

#: The item step, run here on an order's items with WEIR_ITEMS_INLINE (its outcomes are not sent on).
_inline = ItemWorker(
    agent=AGENT,
    step=step,
    results=topics.aggregates,
    concurrent=STEP_RUNS_AT_ONCE,
    concurrency=settings.item_concurrency,
    in_place=STEP_IN_PLACE,
)


@app.agent(topics.orders)
async def splitter(stream: StreamT[bytes]) -> None:
    """Reads orders in batches; sends the item chunks of a batch's orders to the items topic, bundled.

    An order's 'open', when apart from its chunks, goes to the aggregator. With WEIR_ITEMS_INLINE, the
    order's result goes to the aggregates topic instead. A bad order is dead-lettered alone. An order's
    offset is committed with everything it sent: every send is delivered before a commit covers the offset
    (``app.engine.batch_scope``), and under exactly_once they share the transaction of that offset.
    """
    await handle_parts(stream, _inline_part if settings.items_inline else _split_part)


async def _split_part(part: Sequence[EventT[bytes]]) -> None:
    splits: list[tuple[list[Keyed], list[Keyed]]] = []

    async def split(event: EventT[bytes], order: Any) -> None:
        order_id, items = split_order(order)
        deadline_ms = AGGREGATOR.deadline_from(now_ms())
        splits.append(encode_split(order_id, *split_messages(order_id, items, chunk=settings.split_chunk, deadline_ms=deadline_ms)))

    await handle_part_events(part, agent=AGENT, what="splitter: order", handler=split, owed=_owed)
    await send_splits(splits, results=topics.item_results, items=topics.items, size=settings.bundle)


async def _inline_part(part: Sequence[EventT[bytes]]) -> None:
    async def aggregate(event: EventT[bytes], order: Any) -> None:
        order_id, items = split_order(order)
        result = await aggregate_inline(_inline, AGGREGATOR, event, order_id, items)
        await send_result(event, [Output(topics.aggregates, order_id, result, what="the result")], agent=AGENT)

    await handle_part_events(part, agent=AGENT, what="splitter: order", handler=aggregate, concurrent=STEP_RUNS_AT_ONCE, owed=_owed)


async def _owed(event: EventT[bytes], reason: str, error: str) -> None:
    """An order that cannot be split (or run inline) still gets its one result, ``invalid``, keyed by the order's key.

    Whoever waits for the order's result learns that it failed and why; the order itself is in the dead
    letters. An order without a key has nobody to answer: the dead letter is all there is.
    """
    if not event.message.key:
        return
    correlation_id = event.message.key.decode("utf-8", "replace")
    result = invalid_result(correlation_id, AGGREGATOR.name, reason, error)
    await send_checked(event, [Output(topics.aggregates, correlation_id, result, what="the result")], agent=AGENT, step="owed")
