"""The counter trigger's tables, all keyed by parent id (or by partition for the indexes), and the sweep's durable queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faust.types import TableT

from app.core import json_table

__all__ = ["trigger_states", "fired_triggers", "sweep_entries", "expiry_deadlines", "SweepQueue"]


trigger_states = json_table(
    "triggers",
    "Counter triggers by parent id: expected children, the children counted so far with their outcome (each once), "
    "the wake topic; or, before the parent registered, the completions remembered (value: tables.triggers.TriggerState). "
    "Dropped unfired, to the dead letters, WEIR_TRIGGER_ORPHAN_RETENTION_MS after the last event that changed it.",
)
fired_triggers = json_table(
    "triggers_fired",
    "Fired triggers by parent id, kept for the done retention so that redelivered or late completions never fire "
    "them twice; counts the completions absorbed (value: tables.triggers.FiredState).",
)
sweep_entries = json_table(
    "trigger_sweep",
    "The safety sweep's queue (tables.trigger_tables.SweepQueue): per partition, the registered triggers in the order "
    "the sweep may look at them ['<p>:<n>' = [parent id, due ms]], and the cursor '<p>:head' / end '<p>:tail'.",
)
# The table keeps the name it had when it indexed fired markers only: entries already filed in it still come due.
expiry_deadlines = json_table(
    "trigger_fired_deadlines",
    "Deadline index of the triggers' retention, fired markers and unfired state alike (app.deadlines.DeadlineIndex): "
    "per partition, the parents due each second.",
)

#: What a sweep step does with a due trigger: the time to look at it again (still waiting), or None (done with it).
Visit = Callable[[str], Awaitable[int | None]]


class SweepQueue:
    """A durable FIFO of triggers per partition, read page by page from a cursor (keyset pagination on a sequence number).

    Table keys: ``'<p>:tail'`` the next number to file, ``'<p>:head'`` the next number to read, ``'<p>:<n>'`` the n-th
    entry ``[parent id, due ms]``. Entries are filed with ``due = now + a fixed delay``, so they lie in due order and a
    step stops at the first one not due yet: it reads at most one page, whatever the number of waiting triggers.
    Like every table, it is written only while processing an event of that partition.
    """

    def __init__(self, table: TableT[str, Any]) -> None:
        self.table = table

    def file(self, partition: int, entries: Sequence[tuple[str, int]]) -> None:
        """File entries at the end: one write per entry and one for the end, whatever their number."""
        if not entries:
            return
        tail_key = f"{partition}:tail"
        tail = self.table.get(tail_key) or 0
        for number, (parent_id, due_ms) in enumerate(entries, start=tail):
            self.table[f"{partition}:{number}"] = [parent_id, due_ms]
        self.table[tail_key] = tail + len(entries)

    async def step(self, partition: int, now_ms: int, page_size: int, visit: Visit) -> bool:
        """Hand up to ``page_size`` due entries from the cursor to ``visit``, then file again those it keeps.

        Returns whether due entries remain after this page (the caller asks for another step). ``visit`` must keep
        entries with a due time later than ``now_ms``, or a step would meet them again.
        """
        head_key = f"{partition}:head"
        head = self.table.get(head_key) or 0
        tail = self.table.get(f"{partition}:tail") or 0
        number = head
        visited = 0
        again: list[tuple[str, int]] = []
        while number < tail and visited < page_size:
            entry_key = f"{partition}:{number}"
            entry = self.table.get(entry_key)
            if entry is not None:
                parent_id, due_ms = entry
                if due_ms > now_ms:
                    break
                del self.table[entry_key]
                visited += 1
                later = await visit(parent_id)
                if later is not None:
                    again.append((parent_id, later))
            number += 1
        if number != head:
            self.table[head_key] = number
        self.file(partition, again)
        if number >= tail or visited < page_size:
            return False
        following = self.table.get(f"{partition}:{number}")
        return following is None or int(following[1]) <= now_ms

    def due(self, partition: int, now_ms: int, page_size: int) -> list[str]:
        """The parent ids the next :meth:`step` will visit (read only): the page a step reads, to be looked up at once."""
        head = self.table.get(f"{partition}:head") or 0
        tail = self.table.get(f"{partition}:tail") or 0
        found: list[str] = []
        for number in range(head, tail):
            if len(found) >= page_size:
                break
            entry = self.table.get(f"{partition}:{number}")
            if entry is None:
                continue
            parent_id, due_ms = entry
            if due_ms > now_ms:
                break
            found.append(str(parent_id))
        return found

    def waiting(self, partition: int) -> int:
        """How many entries are filed and not read yet in ``partition``."""
        return int(self.table.get(f"{partition}:tail") or 0) - int(self.table.get(f"{partition}:head") or 0)
