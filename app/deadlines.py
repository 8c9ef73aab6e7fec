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

    Table keys: ``'<partition>:next'``, the first second not yet fully walked (before the first walk: the
    earliest second filed); ``'<partition>:walked'``, set by the first walk; ``'<partition>:<second>'``,
    how many entries were filed in that second; ``'<partition>:<second>:<n>'``, the n-th of them. Filing
    an entry writes two small values whatever the number of entries already due in that second, and a
    tick reads only the seconds that passed and the entries due in them. It must be written and walked
    while processing an event of that partition (Faust's rule for tables): the agent that owns the
    partition does it, on a tick. Entries are not removed when their key completes early; the handler
    skips them when they come due.
    """

    def __init__(self, table: TableT[str, Any]) -> None:
        self.table = table

    def add(self, partition: int, kind: str, key: str, due_ms: int) -> None:
        next_key = f"{partition}:next"
        next_bucket = self.table.get(next_key)
        bucket = deadline_bucket(due_ms)
        if next_bucket is None or (bucket < next_bucket and not self.table.get(f"{partition}:walked")):
            # nothing walked yet: the walk starts at the earliest entry, even one filed after a later one
            self.table[next_key] = bucket
        elif bucket < next_bucket:
            bucket = next_bucket  # that second was walked already: the next tick must still see it
        self._file(partition, bucket, [kind, key])

    def _file(self, partition: int, bucket: int, entry: list[str]) -> None:
        count_key = f"{partition}:{bucket}"
        count = self.table.get(count_key) or 0
        self.table[f"{count_key}:{count}"] = entry
        self.table[count_key] = count + 1

    async def walk(self, partition: int, now_ms: int, handle: DueHandler) -> None:
        """Hand every entry due up to ``now_ms`` to ``handle``; drop those it does not keep.

        The walked mark moves to the current second first, so whatever a handler files meanwhile lands
        in this second or later and is handed over on a later tick, never lost.
        """
        next_key = f"{partition}:next"
        first = self.table.get(next_key)
        if first is None:
            return
        current = deadline_bucket(now_ms)
        if current < first:
            return
        if not self.table.get(f"{partition}:walked"):
            self.table[f"{partition}:walked"] = True  # from now on the seconds before 'next' are done
        if current > first:
            self.table[next_key] = current
        for bucket in range(first, current + 1):
            count_key = f"{partition}:{bucket}"
            count = self.table.get(count_key) or 0
            if not count:
                continue
            kept: list[list[str]] = []
            for number in range(count):
                entry_key = f"{count_key}:{number}"
                entry = self.table.get(entry_key)
                if entry is None:
                    continue
                del self.table[entry_key]
                kind, key = entry
                if await handle(kind, key):
                    kept.append([kind, key])
            filed_meanwhile = (self.table.get(count_key) or 0) > count
            if not filed_meanwhile and (bucket != current or not kept):
                del self.table[count_key]
            for entry in kept:
                self._file(partition, current, entry)

    async def walk_keys(
        self,
        partition: int,
        now_ms: int,
        deadline_of: Callable[[str], int | None],
        expire: Callable[[str], Awaitable[None]],
    ) -> None:
        """Walk entries that stand for keyed states whose deadline may have moved since they were filed.

        ``deadline_of(key)`` is the state's current deadline (None: the key is gone, drop the entry). A
        deadline later than this second is filed again at its own second (one entry per key at a time);
        one later in this second is looked at again next tick; one that passed calls ``expire(key)``.
        """

        async def due(kind: str, key: str) -> bool:
            deadline_ms = deadline_of(key)
            if deadline_ms is None:
                return False
            if deadline_ms > now_ms:
                if deadline_bucket(deadline_ms) > deadline_bucket(now_ms):
                    self.add(partition, kind, key, deadline_ms)
                    return False
                return True
            await expire(key)
            return False

        await self.walk(partition, now_ms, due)
