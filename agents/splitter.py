"""Splitter: an order of N items becomes item messages of up to ``split_chunk`` items each, then its offset commits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from faust.types import EventT, StreamT

from app.aggregation import Keyed, encode_split, send_splits, split_messages
from app.core import app, handle_part_events, handle_parts, now_ms, settings, topics
from app.split import split_order

__all__ = ["splitter"]

AGENT = "splitter"


@app.agent(topics.orders)
async def splitter(stream: StreamT[bytes]) -> None:
    """Reads orders in batches; sends the item chunks of a batch's orders to the items topic, bundled.

    An order's 'open', when apart from its chunks, goes to the aggregator.

    A bad order is dead-lettered alone. An order's offset is committed with everything it sent: every send
    is delivered before a commit covers the offset (``app.eos.batch_scope``), and under exactly_once they
    share the transaction of that offset.
    """
    await handle_parts(stream, _split_part)


async def _split_part(part: Sequence[EventT[bytes]]) -> None:
    splits: list[tuple[list[Keyed], list[Keyed]]] = []

    async def split(event: EventT[bytes], order: Any) -> None:
        order_id, items = split_order(order)
        deadline_ms = now_ms() + settings.aggregate_timeout_ms
        splits.append(encode_split((order_id, *split_messages(order_id, items, chunk=settings.split_chunk, deadline_ms=deadline_ms))))

    await handle_part_events(part, agent=AGENT, what="splitter: order", handler=split)
    await send_splits(splits, results=topics.item_results, items=topics.items, size=settings.bundle)
