"""A durable deadline index inside a Faust table: ticks walk the seconds that passed, not every key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from faust.types import TableT

__all__ = ["DeadlineIndex", "deadline_bucket"]

#: What a walk does with a due entry: True keeps it for a later tick (its deadline is not reached yet).
DueHandler = Callable[[str, str], Awaitable[bool]]


def deadline_bucket(deadline_ms: int, bucket_ms: int = 1000) -> int:
    """The index bucket (second) a deadline falls in."""
    return deadline_ms // bucket_ms


class DeadlineIndex:
    """Entries ``[kind, key]`` filed by the second they fall due, per partition, in ``table``.

    Keys are ``'<partition>:<second>'`` (the entries due in that second) and ``'<partition>:next'`` (the
    first second not yet fully walked). It must be written and walked while processing an event of that
    partition (Faust's rule for tables): the agent that owns the partition does it, on a tick. Entries
    are not removed when their key completes early; the walk skips them, so the cost of a tick is the
    seconds that passed plus the entries that fell due in them.
    """

    def __init__(self, table: TableT[str, Any]) -> None:
        self.table = table

    def add(self, partition: int, kind: str, key: str, due_ms: int) -> None:
        next_key = f"{partition}:next"
        next_bucket = self.table.get(next_key)
        bucket = deadline_bucket(due_ms)
        if next_bucket is None:
            self.table[next_key] = bucket
        elif bucket < next_bucket:
            bucket = next_bucket  # that second was walked already: the next tick must still see it
        self._append(f"{partition}:{bucket}", [kind, key])

    async def walk(self, partition: int, now_ms: int, handle: DueHandler) -> None:
        """Hand every entry due up to ``now_ms`` to ``handle``; drop those it does not keep.

        A bucket is taken out of the table before its entries are handled, so a handler may file new
        entries (even into the bucket being walked) without them being overwritten.
        """
        next_key = f"{partition}:next"
        first = self.table.get(next_key)
        if first is None:
            return
        current = deadline_bucket(now_ms)
        for bucket in range(first, current + 1):
            bucket_key = f"{partition}:{bucket}"
            entries = self.table.get(bucket_key)
            if not entries:
                continue
            del self.table[bucket_key]
            for kind, key in entries:
                if await handle(kind, key):
                    self._append(bucket_key, [kind, key])
        if current > first:
            self.table[next_key] = current

    def _append(self, bucket_key: str, entry: list[str]) -> None:
        entries = list(self.table.get(bucket_key) or [])
        if entry not in entries:
            entries.append(entry)
            self.table[bucket_key] = entries
