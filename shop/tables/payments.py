"""The shop's payments table's view (the table itself is the payment stage's: shop.stages.PAYMENTS_TABLE)."""

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
