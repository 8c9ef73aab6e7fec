"""A durable deadline index inside a Faust table: ticks walk the seconds that passed, not every key."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faust.types import TableT

__all__ = ["DeadlineIndex", "deadline_bucket"]

#: What a walk does with a due entry: True keeps it for a later tick (its deadline is not reached yet).
DueHandler = Callable[[str, str], Awaitable[bool]]
#: Told of an entry whose handler failed every attempt: (kind, key, the last error).
GiveUpHandler = Callable[[str, str, Exception], Awaitable[None]]

log = logging.getLogger(__name__)

#: How many ticks try an entry whose handler raises before it is given up.
MAX_ATTEMPTS = 3
#: Seconds one walk steps through at most: a tick stays short after a long stop; the next ticks catch up.
MAX_SECONDS_PER_WALK = 3600
#: Keys one entry holds at most when the entries a scope files in one second are merged, and the longest key merged
#: (a longer one gets an entry of its own): a merged entry stays under 30 KB.
MAX_KEYS_PER_ENTRY = 100
MAX_MERGED_KEY_LENGTH = 256


def deadline_bucket(deadline_ms: int, bucket_ms: int = 1000) -> int:
    """The index bucket (second) a deadline falls in."""
    return deadline_ms // bucket_ms


class DeadlineIndex:
    """Entries ``[kind, key]`` filed by the second they fall due, per partition, in ``table``.

    Table keys: ``'<partition>:next'``, the first second not yet fully walked (before the first walk: the
    earliest second filed); ``'<partition>:walked'``, set by the first walk; ``'<partition>:<second>'``,
    how many entries were filed in that second; ``'<partition>:<second>:<n>'``, the n-th of them:
    ``[kind, key]``, or ``[kind, [key, ...]]`` for keys of one kind filed in that second by one scope (a
    part of a batch: a table with ``written_in_scope``, :class:`app.engine.WeirTable`), merged into the
    entry the scope filed last, up to :data:`MAX_KEYS_PER_ENTRY`; an entry whose handler failed carries
    its failures third. Filing an entry writes two small values whatever the number of entries already
    due in that second (and a part that completes a hundred groups files one entry, not a hundred), and a
    tick reads only the seconds that passed and the entries due in them. It must be written and walked
    while processing an event of that partition (Faust's rule for tables): the agent that owns the
    partition does it, on a tick. Entries are not removed when their key completes early; the handler
    skips them when they come due. A walk's cursor only moves past seconds fully handled (:meth:`walk`).
    """

    def __init__(self, table: TableT[str, Any], *, max_attempts: int = MAX_ATTEMPTS, fatal: tuple[type[BaseException], ...] = ()) -> None:
        self.table = table
        self.max_attempts = max(1, max_attempts)
        #: errors that stop the walk at once instead of counting against the entry (a send that failed)
        self.fatal = fatal
        #: seconds one walk steps through at most (the rest on the next ticks)
        self.max_seconds_per_walk = MAX_SECONDS_PER_WALK
        #: the entry whose keys a walk is handing over: nothing filed meanwhile joins it (its keys are being iterated)
        self._walking: str | None = None

    def add(self, partition: int, kind: str, key: str, due_ms: int, *, now_ms: int | None = None) -> None:
        """File ``key`` to come due at ``due_ms``; with ``now_ms``, a deadline already past is filed in the current second.

        (A deadline far in the past, from a bad or very late input, would otherwise make the next walk step
        through every second since.)
        """
        next_key = f"{partition}:next"
        next_bucket = self.table.get(next_key)
        bucket = deadline_bucket(due_ms)
        if now_ms is not None:
            bucket = max(bucket, deadline_bucket(now_ms))
        if next_bucket is None or (bucket < next_bucket and not self.table.get(f"{partition}:walked")):
            # nothing walked yet: the walk starts at the earliest entry, even one filed after a later one
            self.table[next_key] = bucket
        elif bucket < next_bucket:
            bucket = next_bucket  # that second was walked already: the next tick must still see it
        self._file(partition, bucket, [kind, key])

    def _file(self, partition: int, bucket: int, entry: list[Any]) -> None:
        count_key = f"{partition}:{bucket}"
        count = self.table.get(count_key) or 0
        if count and len(entry) == 2 and len(entry[1]) <= MAX_MERGED_KEY_LENGTH and self._merged(f"{count_key}:{count - 1}", entry):
            return
        self.table[f"{count_key}:{count}"] = entry
        self.table[count_key] = count + 1

    def _merged(self, entry_key: str, entry: list[Any]) -> bool:
        """Whether ``entry`` joined the one at ``entry_key``: filed by this scope (not written out yet), of the same
        kind, without failures, with room. An entry of an earlier scope is never changed: it may be written out,
        or walked already."""
        written_in_scope = getattr(self.table, "written_in_scope", None)
        if written_in_scope is None or entry_key == self._walking:
            return False
        last = written_in_scope(entry_key)
        if not isinstance(last, list) or len(last) != 2 or last[0] != entry[0]:
            return False
        keys = last[1] if isinstance(last[1], list) else [last[1]]
        if len(keys) >= MAX_KEYS_PER_ENTRY or len(keys[0]) > MAX_MERGED_KEY_LENGTH:  # the first may have been filed alone
            return False
        keys.append(entry[1])
        self.table[entry_key] = [last[0], keys]
        return True

    async def walk(self, partition: int, now_ms: int, handle: DueHandler, *, on_give_up: GiveUpHandler | None = None) -> None:
        """Hand every entry due up to ``now_ms`` to ``handle``; drop those it does not keep.

        The cursor (``'<partition>:next'``) moves past a second only once every entry of that second was
        handled, and an entry is deleted only after its handler returned: a walk that stops part-way (an
        exception, a crash) resumes on the next tick where it stopped. An entry whose handler raises stays
        in its second with its failures counted, and the walk goes on with the other entries: one bad key
        does not hold back the others. After :attr:`max_attempts` failures the entry is dropped and
        ``on_give_up(kind, key, error)`` is told (the shell dead-letters the key). Entries filed by a handler
        meanwhile land in a second not yet walked, or in the one being walked, and are handed over too.
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
        resume_at: int | None = None
        # A worker that was down for long walks the seconds it missed a bounded number per tick.
        last = min(current, first + self.max_seconds_per_walk - 1)
        for bucket in range(first, last + 1):
            count_key = f"{partition}:{bucket}"
            kept: list[list[str]] = []
            failed = False
            number = 0
            # Read again each time: a handler may file in this second. A handler that files without end would
            # hold the walk here; past a bound the rest is left to the next tick.
            bound = 2 * (self.table.get(count_key) or 0) + 1000
            while number < min(bound, self.table.get(count_key) or 0):
                entry_key = f"{count_key}:{number}"
                number += 1
                entry = self.table.get(entry_key)
                if entry is None:
                    continue
                kind, keys, failures = entry[0], entry[1], (entry[2] if len(entry) > 2 else 0)
                many = isinstance(keys, list)
                failing: list[tuple[str, Exception]] = []
                self._walking = entry_key
                try:
                    for key in keys if many else [keys]:
                        try:
                            keep = await handle(kind, key)
                        except asyncio.CancelledError:
                            raise
                        except Exception as error:
                            if isinstance(error, self.fatal):
                                raise  # the entry stays whole: the keys before come again (the batch's transaction aborts)
                            failing.append((key, error))
                            continue
                        if keep:
                            kept.append([kind, key])
                finally:
                    self._walking = None
                if failing:
                    # Every key left failed in every attempt so far: the entry's count is each key's.
                    failures += 1
                    if failures < self.max_attempts:
                        for key, problem in failing:
                            log.warning("deadline index: %s %r failed (%d of %d): %r", kind, key, failures, self.max_attempts, problem)
                        left = [key for key, _ in failing]
                        self.table[entry_key] = [kind, left if many else left[0], failures]
                        failed = True
                        continue
                    del self.table[entry_key]
                    for key, problem in failing:
                        log.error("deadline index: %s %r failed %d times, given up: %r", kind, key, failures, problem)
                        if on_give_up is not None:
                            await on_give_up(kind, key, problem)
                    continue
                del self.table[entry_key]
            if number >= bound:
                failed = True
            if failed:
                resume_at = bucket if resume_at is None else resume_at
            elif self.table.get(count_key) is not None:
                del self.table[count_key]
            for entry in kept:
                self._file(partition, current, entry)
            if resume_at is None:
                # Past this second: what a handler files from now on for an earlier one lands in the next (add).
                self.table[next_key] = min(bucket + 1, current)
        if last < current and resume_at is None:
            self.table[next_key] = last + 1

    async def walk_keys(
        self,
        partition: int,
        now_ms: int,
        deadline_of: Callable[[str, str], int | None],
        expire: Callable[[str, str], Awaitable[None]],
        *,
        on_give_up: GiveUpHandler | None = None,
    ) -> None:
        """Walk entries that stand for keyed states whose deadline may have moved since they were filed.

        ``deadline_of(kind, key)`` is the state's current deadline for an entry of that kind (None: nothing is
        due any more, drop the entry). A deadline later than this second is filed again at its own second (one
        entry per key at a time); one later in this second is looked at again next tick; one that passed calls
        ``expire(kind, key)``. Failures are handled as in :meth:`walk`.
        """

        async def due(kind: str, key: str) -> bool:
            deadline_ms = deadline_of(kind, key)
            if deadline_ms is None:
                return False
            if deadline_ms > now_ms:
                if deadline_bucket(deadline_ms) > deadline_bucket(now_ms):
                    self.add(partition, kind, key, deadline_ms)
                    return False
                return True
            await expire(kind, key)
            return False

        await self.walk(partition, now_ms, due, on_give_up=on_give_up)
