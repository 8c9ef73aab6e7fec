"""The shop's stock table, and what the kitchen remembers of orders it settled."""

from __future__ import annotations

from weir.app.core import json_table
from weir.app.runtime.views import register_view

__all__ = ["stock", "settled", "settled_deadlines"]

stock = json_table(
    "shop_stock",
    "Stock per flavour, one container per key, owned by one kitchen worker at a time: scoops available, "
    "reserved per order, delivered (value: shop.state.Stock).",
)
settled = json_table(
    "shop_kitchen_settled",
    "Orders the kitchen delivered or released, per flavour (key 'flavour/ticket', value: when), kept for "
    "the done retention: a reservation that comes again after that reserves nothing.",
)
settled_deadlines = json_table(
    "shop_kitchen_settled_deadlines",
    "Deadline index of table shop_kitchen_settled (app.deadlines.DeadlineIndex).",
)

register_view(
    "shop_stock",
    title="stock per flavour",
    summarize=lambda value, now_ms: {
        "available": value["available"],
        "reserved_orders": len(value["reserved"]),
        "reserved_scoops": sum(value["reserved"].values()),
        "delivered": value["delivered"],
        "opening": value["initial"],
    },
)
