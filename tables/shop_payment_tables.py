"""The shop's payments table."""

from __future__ import annotations

from app.core import json_table

__all__ = ["payments"]

payments = json_table(
    "shop_payments",
    "Payments by order ticket: captured, then committed or voided, or rejected (value: tables.shop.Payment).",
)
