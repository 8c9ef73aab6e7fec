"""aiokafka's consumer client under Faust: the offsets its fetcher stepped over, fetch positions, pausing fetches.

Everything here reads or changes the aiokafka consumer behind Faust's consumer thread (its subscription
state, its fetcher's buffer) or wraps aiokafka's ``PartitionRecords``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from aiokafka.structs import TopicPartition
from faust.types import TP
from intervaltree import IntervalTree  # type: ignore[import-untyped]

__all__ = [
    "SkippedOffsets",
    "skipped_offsets",
    "note_skipped_offsets",
    "kafka_client",
    "kafka_assignment",
    "assigned_position",
    "fetch_position",
    "set_fetching",
    "until_listed",
]


class SkippedOffsets:
    """Per partition, the offsets aiokafka's fetcher stepped over itself: transaction markers, aborted records.

    A read_committed fetch returns no record for a transaction marker or an aborted transaction's records:
    a hole between the offset a fetch started at (or its previous record) and its next record is the
    fetcher's own doing, and legitimate. A hole that no fetch stepped over is not: the fetch position
    moved past records nobody delivered (seen after takeovers; once it lost a single record that a
    one-offset rule took for a transaction marker). ``aiokafka``'s ``PartitionRecords`` is wrapped
    (:func:`note_skipped_offsets`) to note each stepped-over range as its records are read; the delivery loop
    believes a hole only when it is covered, and fetches again from the expected offset otherwise.
    """

    KEEP = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ranges: dict[tuple[str, int], IntervalTree] = {}

    def note(self, topic: str, partition: int, begin: int, end: int) -> None:
        if end <= begin:
            return
        with self._lock:
            tree = self._ranges.setdefault((topic, partition), IntervalTree())
            tree.addi(begin, end)
            if len(tree) > self.KEEP:
                tree.merge_overlaps(strict=False)
                if len(tree) > self.KEEP:
                    oldest = sorted(tree, key=lambda interval: interval.begin)[: len(tree) - self.KEEP // 2]
                    for interval in oldest:
                        tree.remove(interval)

    def covers(self, topic: str, partition: int, begin: int, end: int) -> bool:
        """Whether every offset in ``[begin, end)`` was stepped over by a fetch."""
        with self._lock:
            tree = self._ranges.get((topic, partition))
            if tree is None:
                return False
            # from interval to interval: a few point lookups, and an early no at the first offset not covered
            # (recovery asks after every restored record, over the rest of the partition)
            position = begin
            while position < end:
                found = tree.at(position)
                if not found:
                    return False
                position = max(interval.end for interval in found)
            return True


skipped_offsets = SkippedOffsets()


def note_skipped_offsets() -> None:
    """Wrap aiokafka's ``PartitionRecords`` so that every fetch notes the offsets it steps over (:class:`SkippedOffsets`)."""
    from aiokafka.consumer import fetcher

    records_class: Any = fetcher.PartitionRecords
    if getattr(records_class, "_weir_notes_skips", False):
        return
    original_init, original_next = records_class.__init__, records_class.__next__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._weir_next = self.next_fetch_offset  # the fetch offset: the first offset this fetch owes

    def __next__(self: Any) -> Any:
        tp = self._tp
        try:
            record = original_next(self)
        except StopIteration:
            # markers or aborted records at the end of the fetched data
            skipped_offsets.note(tp.topic, tp.partition, self._weir_next, self.next_fetch_offset)
            self._weir_next = max(self._weir_next, self.next_fetch_offset)
            raise
        skipped_offsets.note(tp.topic, tp.partition, self._weir_next, record.offset)
        self._weir_next = record.offset + 1
        return record

    records_class.__init__ = __init__
    records_class.__next__ = __next__
    records_class._weir_notes_skips = True


def kafka_client(consumer: Any) -> Any:
    """The aiokafka consumer behind a Faust consumer's thread (None: not started)."""
    return getattr(getattr(consumer, "_thread", None), "_consumer", None)


def kafka_assignment(consumer: Any) -> Any:
    """aiokafka's current assignment of a Faust consumer's client (None: not started, or between assignments)."""
    aiokafka_consumer = kafka_client(consumer)
    try:
        return aiokafka_consumer._subscription.subscription.assignment if aiokafka_consumer is not None else None
    except AttributeError:
        return None


def assigned_position(assignment: Any, tp: TP) -> int | None:
    """The fetch position of ``tp`` in an aiokafka assignment (None: not assigned, or no position yet)."""
    try:
        state = assignment.state_value(tp)
        return int(state.position) if state is not None and state.has_valid_position else None
    except (KeyError, AssertionError, AttributeError):  # revoked or being reset meanwhile
        return None


def fetch_position(app: Any, tp: TP) -> int | None:
    """The consumer's fetch position of ``tp`` now (None: not assigned, or no position yet)."""
    assignment = kafka_assignment(app.consumer)
    return None if assignment is None else assigned_position(assignment, tp)


async def until_listed(client: Any, topics: set[str], within_s: float, every_s: float = 0.1) -> list[str]:
    """Wait until the broker's metadata lists every topic of ``topics`` (an aiokafka client's fresh metadata).

    Returns the topics still missing after ``within_s`` (none: all listed). ``WeirConsumerThread.subscribe``
    (:mod:`app.engine.delivery`) joins a group only after this.
    """
    deadline = time.monotonic() + within_s
    while True:
        listed = await client.fetch_all_metadata()
        missing = sorted(topic for topic in topics if not listed.partitions_for_topic(topic))
        if not missing or time.monotonic() > deadline:
            return missing
        await asyncio.sleep(every_s)


def set_fetching(client: Any, partitions: list[TopicPartition], fetch: bool) -> None:
    """Resume (``fetch``) or pause fetching ``partitions`` in an aiokafka consumer; run in its loop.

    A paused partition's fetched and unconsumed records are dropped: its position did not move past them,
    so they are fetched again once it is resumed. Partitions no longer assigned are left alone.
    """
    subscription = client._subscription
    buffered = client._fetcher._records
    for tp in partitions:
        if not subscription.is_assigned(tp):
            continue
        if fetch:
            subscription.resume(tp)
        else:
            subscription.pause(tp)
            buffered.pop(tp, None)
