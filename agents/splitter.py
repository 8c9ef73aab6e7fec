"""Splitter: an order of N items becomes N item messages (correlation id, index, total), then its offset commits."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from app.codec import dumps
from app.core import InvalidMessage, app, handle_events, now_ms, settings, topics

__all__ = ["split_order", "MAX_ITEMS_PER_ORDER"]

MAX_ITEMS_PER_ORDER = 10_000
AGENT = "splitter"


def split_order(order: Any) -> tuple[str, list[Any]]:
    """The order's correlation id and its items, or :class:`InvalidMessage` naming what is wrong."""
    if not isinstance(order, dict):
        message = f"splitter: an order must be a JSON object, got {type(order).__name__}"
        raise InvalidMessage(message)
    order_id = order.get("order_id")
    if not isinstance(order_id, str) or not order_id:
        message = f"splitter: field 'order_id' must be a non-empty string, got {order_id!r}"
        raise InvalidMessage(message)
    items = order.get("items")
    if not isinstance(items, list) or not items:
        message = f"splitter: order {order_id!r} field 'items' must be a non-empty list, got {type(items).__name__}"
        raise InvalidMessage(message)
    if len(items) > MAX_ITEMS_PER_ORDER:
        message = f"splitter: order {order_id!r} has {len(items)} items, more than the limit of {MAX_ITEMS_PER_ORDER}"
        raise InvalidMessage(message)
    return order_id, items


@app.agent(topics.orders)
async def splitter(stream: StreamT[bytes]) -> None:
    """Reads orders; writes one 'open' to the aggregator and one message per item to the items topic.

    The order's offset is committed after its processing returns, and every send is awaited first (under
    exactly_once they share the transaction of the order's offset): no half-split order after a crash.
    """
    await handle_events(stream, agent=AGENT, what="splitter: order", handler=_split)


async def _split(event: EventT, order: Any) -> None:
    order_id, items = split_order(order)
    total = len(items)
    opened = {"kind": "open", "correlation_id": order_id, "total": total, "deadline_ms": now_ms() + settings.aggregate_timeout_ms}
    sends = [await topics.item_results.send(key=order_id.encode(), value=dumps(opened))]
    for index, payload in enumerate(items):
        item = {"correlation_id": order_id, "index": index, "total": total, "last": index == total - 1, "payload": payload}
        sends.append(await topics.items.send(key=f"{order_id}#{index}".encode(), value=dumps(item)))
    for sent in sends:
        await sent
