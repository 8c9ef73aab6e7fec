"""The aggregator's tables: open groups, completed groups, and the deadline index that ticks walk."""

from __future__ import annotations

from app.core import json_table

__all__ = ["open_groups", "done_groups", "deadlines"]


open_groups = json_table(
    "aggregates",
    "Open split groups by correlation id: items received by index (ok/failed), expected count, deadline "
    "(value: tables.aggregates.GroupState).",
)
done_groups = json_table(
    "aggregates_done",
    "Completed groups, kept for the done retention to count late items, which are never merged (value: tables.aggregates.DoneState).",
)
deadlines = json_table(
    "aggregate_deadlines",
    "Deadline index of the aggregator (app.deadlines.DeadlineIndex): per partition, the entries "
    "[kind, correlation id] due in each second, and the first second not yet walked by the ticks.",
)
