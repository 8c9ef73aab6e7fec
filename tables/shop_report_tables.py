"""The shop's reports table."""

from __future__ import annotations

from app.core import json_table

__all__ = ["reports"]

reports = json_table(
    "shop_reports",
    "Each screen's day: outcomes counted once per line, served, aborted by reason, revenue, and the "
    "number of lines its end announced (value: tables.shop.ScreenReport).",
)
