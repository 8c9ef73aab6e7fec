"""The EOF aggregator's tables: per-client totals per flavour and their deadline index."""

from __future__ import annotations

from app.core import json_table

__all__ = ["totals", "totals_deadlines"]

totals = json_table(
    "eof_totals",
    "EOF aggregator, per client: scoops per flavour of the batches merged so far (by batch id), the number of "
    "batches the controller said to expect, and the tombstone of a cleaned-up client (value: tables.eof.ClientTotals).",
)
totals_deadlines = json_table(
    "eof_totals_deadlines",
    "Deadline index of the EOF aggregator (app.deadlines.DeadlineIndex): idle clients and tombstones to drop.",
)
