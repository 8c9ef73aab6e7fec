"""Splitter: an order of N items becomes item messages of up to ``split_chunk`` items each, then its offset commits."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from app.aggregation import send_split, split_messages
from app.core import app, handle_events, now_ms, settings, topics
from app.split import split_order

__all__ = ["splitter"]

AGENT = "splitter"


@app.agent(topics.orders)
async def splitter(stream: StreamT[bytes]) -> None:
    """Reads orders in batches; writes the order's item chunks to the items topic, its 'open' to the aggregator (or in its only chunk).

    The order's offset is committed with everything it sent: every send is delivered before a commit covers
    the offset (``app.eos.batch_scope``), and under exactly_once they share the transaction of that offset.
    """
    await handle_events(stream, agent=AGENT, what="splitter: order", handler=_split, batched=True)


async def _split(event: EventT[bytes], order: Any) -> None:
    order_id, items = split_order(order)
    opened, chunks = split_messages(order_id, items, chunk=settings.split_chunk, deadline_ms=now_ms() + settings.aggregate_timeout_ms)
    await send_split(order_id, opened, chunks, results=topics.item_results, items=topics.items)
