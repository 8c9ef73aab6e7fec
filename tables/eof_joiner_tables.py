"""The EOF joiner's tables: per-client price lists and totals, and their deadline index."""

from __future__ import annotations

from app.core import json_table

__all__ = ["joins", "joins_deadlines"]

joins = json_table(
    "eof_joins",
    "EOF joiner, per client: the price list the gateway sent, the totals the aggregator flushed, whether the report "
    "(the two joined) went out, and the tombstone of a cleaned-up client (value: tables.eof.ClientJoin).",
)
joins_deadlines = json_table(
    "eof_joins_deadlines",
    "Deadline index of the EOF joiner (app.deadlines.DeadlineIndex): stray clients and tombstones to drop.",
)
