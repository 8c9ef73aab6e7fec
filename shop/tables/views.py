"""The web views of the shop's tables (the tables themselves are its stages': shop/stages)."""

from __future__ import annotations

from weir.app.runtime.views import register_view

__all__: list[str] = []

register_view(
    "shop_payments",
    title="payments by state",
    summarize=lambda value, now_ms: {
        "state": value["state"],
        "amount_cents": value["amount_cents"],
        "card": f"**** {value.get('card_last4') or '?'}",
        "reason": value.get("reason"),
        "updated_ms": value["updated_ms"],
    },
    group_by=lambda value: str(value["state"]),
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
