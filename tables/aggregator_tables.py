"""The aggregator's tables: open groups, completed groups, and the deadline index that ticks walk."""

from __future__ import annotations

from typing import Any

import faust
from faust.types import TableT

from app.core import app, settings

__all__ = ["open_groups", "done_groups", "deadlines"]


def _table(name: str, help_text: str) -> TableT[str, Any]:
    return app.Table(
        name,
        default=None,
        partitions=settings.partitions,
        schema=faust.Schema(key_serializer="json", value_serializer="json"),
        help=help_text,
        changelog_topic=app.topic(
            settings.topic(f"{name}-changelog"),
            partitions=settings.partitions,
            compacting=True,
            key_serializer="json",
            value_serializer="json",
        ),
    )


open_groups = _table(
    "aggregates",
    "Open split groups by correlation id: items received by index (ok/failed), expected count, deadline "
    "(value: tables.aggregates.GroupState).",
)
done_groups = _table(
    "aggregates_done",
    "Completed groups, kept for the done retention to count late items, which are never merged (value: tables.aggregates.DoneState).",
)
deadlines = _table(
    "aggregate_deadlines",
    "Deadline index of the aggregator (app.deadlines.DeadlineIndex): per partition, the entries "
    "[kind, correlation id] due in each second, and the first second not yet walked by the ticks.",
)
