"""The shop's order ids table: which line of a screen's day took each order id."""

from __future__ import annotations

from app.core import json_table
from app.runtime.views import register_view

__all__ = ["order_ids"]

order_ids = json_table(
    "shop_order_ids",
    "Order ids taken on a screen's day, keyed by [screen, order id]: the ticket and line that took it; a later "
    "line with the same id is answered 'duplicate' and never charged (value: tables.shop.OrderClaim).",
)

register_view(
    "shop_order_ids",
    title="order ids taken per screen",
    summarize=lambda value, now_ms: {"screen": value["screen"], "order_id": value["order_id"], "line": value["line"]},
    group_by=lambda value: str(value["screen"]),
)
