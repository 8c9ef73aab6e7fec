"""Splitter: an order of N items becomes N item messages (correlation id, index, total), then its offset commits."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from app.codec import dumps
from app.core import app, handle_events, now_ms, settings, topics
from app.split import split_order

__all__ = ["splitter"]

AGENT = "splitter"


@app.agent(topics.orders)
async def splitter(stream: StreamT[bytes]) -> None:
    """Reads orders; writes one 'open' to the aggregator and one message per item to the items topic.

    The order's offset is committed after its processing returns, and every send is awaited first (under
    exactly_once they share the transaction of the order's offset): no half-split order after a crash.
    """
    await handle_events(stream, agent=AGENT, what="splitter: order", handler=_split)


async def _split(event: EventT[bytes], order: Any) -> None:
    order_id, items = split_order(order)
    total = len(items)
    opened = {"kind": "open", "correlation_id": order_id, "total": total, "deadline_ms": now_ms() + settings.aggregate_timeout_ms}
    sends = [await topics.item_results.send(key=order_id.encode(), value=dumps(opened))]
    for index, payload in enumerate(items):
        item = {"correlation_id": order_id, "index": index, "total": total, "last": index == total - 1, "payload": payload}
        sends.append(await topics.items.send(key=f"{order_id}#{index}".encode(), value=dumps(item)))
    for sent in sends:
        await sent
