"""The splitter's pure part: what a valid order is, and its items."""

from __future__ import annotations

from typing import Any

__all__ = ["InvalidMessage", "split_order", "MAX_ITEMS_PER_ORDER"]

MAX_ITEMS_PER_ORDER = 10_000


class InvalidMessage(ValueError):
    """A decoded message does not have the expected shape; the text names the field."""


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
