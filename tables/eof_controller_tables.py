"""The EOF controller's tables: per-client batch counters and their deadline index."""

from __future__ import annotations

from app.core import json_table

__all__ = ["counters", "counter_deadlines"]

counters = json_table(
    "eof_counters",
    "EOF controller, per client: batches the gateway sent, filter reports by batch id (batches forwarded), whether "
    "the aggregator was told to finish, and the tombstone of a cleaned-up client (value: tables.eof.ControllerState).",
)
counter_deadlines = json_table(
    "eof_counter_deadlines",
    "Deadline index of the EOF controller (app.deadlines.DeadlineIndex): idle clients and tombstones to drop.",
)
