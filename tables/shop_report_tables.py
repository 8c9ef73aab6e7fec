"""The shop's reports table."""

from __future__ import annotations

from app.core import json_table
from app.runtime.views import register_view
from tables.shop import ScreenReport, lines_counted

__all__ = ["reports"]

reports = json_table(
    "shop_reports",
    "Each screen's day: outcomes counted once per line, served, aborted by reason, invalid, duplicate, revenue, and the "
    "number of lines its end announced (value: tables.shop.ScreenReport).",
)

register_view(
    "shop_reports",
    title="screens' end of day",
    summarize=lambda value, now_ms: {
        "lines_seen": lines_counted(ScreenReport.from_dict(value).lines_seen),
        "expected_lines": value["expected_lines"],
        "served": value["served"],
        "aborted": sum(value["aborted"].values()),
        "invalid": value["invalid"],
        "duplicate": value.get("duplicate", 0),
        "revenue_cents": value["revenue_cents"],
        "flushed": value["flushed"],
    },
)
