"""The shop's stock table."""

from __future__ import annotations

from app.core import json_table
from app.web import register_view

__all__ = ["stock"]

stock = json_table(
    "shop_stock",
    "Stock per flavour, one container per key, owned by one kitchen worker at a time: scoops available, "
    "reserved per order, delivered (value: tables.shop.Stock).",
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
