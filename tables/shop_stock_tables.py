"""The shop's stock table."""

from __future__ import annotations

from app.core import json_table

__all__ = ["stock"]

stock = json_table(
    "shop_stock",
    "Stock per flavour, one container per key, owned by one kitchen worker at a time: scoops available, "
    "reserved per order, delivered (value: tables.shop.Stock).",
)
