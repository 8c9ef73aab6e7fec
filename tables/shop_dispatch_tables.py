"""The shop's dispatch table and its deadline index."""

from __future__ import annotations

from app.core import json_table

__all__ = ["dispatch", "dispatch_deadlines"]

dispatch = json_table(
    "shop_dispatch",
    "Orders at the dispatch barrier by ticket: the kitchen's answer per flavour and the payment's, the "
    "deadline; then the outcome, kept to compensate late answers (value: tables.shop.Dispatch or "
    "DispatchDone).",
)
dispatch_deadlines = json_table(
    "shop_dispatch_deadlines",
    "Deadline index of table shop_dispatch (app.deadlines.DeadlineIndex).",
)
