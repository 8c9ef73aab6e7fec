"""The safety sweep's durable queue of the counter triggers (their tables are declared by ``app.trigger_topology``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from faust.types import TableT

__all__ = ["SweepQueue"]


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
