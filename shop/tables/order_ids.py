"""The shop's order ids table: which line of a screen's day took each order id, by screen and shard."""

from __future__ import annotations

from weir.app.core import json_table
from weir.app.runtime.views import register_view

__all__ = ["order_ids", "order_ids_deadlines"]

order_ids = json_table(
    "shop_order_ids",
    "Order ids taken on a screen's day, keyed by [screen, shard]: each id with the ticket and line that took it; a "
    "later line with the same id is answered 'duplicate' and never charged. The day's cleanup leaves each shard a "
    "tombstone for WEIR_EOF_CLOSED_RETENTION_MS, then it goes (value: shop.state.ClaimShard).",
)
order_ids_deadlines = json_table(
    "shop_order_ids_deadlines",
    "Deadline index of the order ids (app.deadlines.DeadlineIndex): tombstones of cleaned-up days to drop.",
)

register_view(
    "shop_order_ids",
    title="order ids taken per screen",
    summarize=lambda value, now_ms: {
        "screen": value["screen"],
        "shard": value["shard"],
        "order_ids": len(value.get("taken") or {}),
        "closed": value.get("closed_ms") is not None,
    },
    group_by=lambda value: str(value["screen"]),
)
