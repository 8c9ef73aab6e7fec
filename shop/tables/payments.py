"""The shop's payments table."""

from __future__ import annotations

from weir.app.core import json_table
from weir.app.runtime.views import register_view

__all__ = ["payments"]

payments = json_table(
    "shop_payments",
    "Payments by order ticket: the gateway's decision, captured then committed or voided, or rejected and why; the card "
    "as its token and last four digits (value: shop.state.Payment).",
)

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
