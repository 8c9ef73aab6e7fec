"""Pages of the dead-letter topic, newest first, through one long-lived read_committed consumer per worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = [
    "Window",
    "Page",
    "parse_before",
    "format_before",
    "chunk_start",
    "merge_newest",
    "DeadLetterReader",
    "CHUNK_MIN_OFFSETS",
    "MAX_SCAN_PER_LIMIT",
]

#: The smallest backwards step of a read, in offsets: fewer round trips when transaction markers sit between records.
CHUNK_MIN_OFFSETS = 64
#: A page scans at most this many offsets per record asked for, per partition (markers and aborted records
#: take offsets too); a partition that holds fewer records than that in the range is paged past, not read whole.
MAX_SCAN_PER_LIMIT = 20
READ_TIMEOUT_S = 5.0

#: One dead letter as the views show it (see ``app.web.decode_dead_letter``).
Entry = dict[str, Any]
Decode = Callable[..., Entry]


@dataclass
class Window:
    """What a page has read of one partition: every record with ``low <= offset < high``, oldest first.

    ``start`` is the partition's first offset: below ``low`` there is more to read while ``low > start``.
    """

    partition: int
    start: int
    low: int
    high: int
    entries: list[Entry] = field(default_factory=list)

    @property
    def more_below(self) -> bool:
        return self.low > self.start


@dataclass(frozen=True)
class Page:
    entries: list[Entry]
    #: Per partition, the offset the next page reads below (None: nothing older is left).
    next_before: dict[int, int] | None


def parse_before(raw: str, partitions: int) -> dict[int, int]:
    """``?before=0:120,1:98`` as {partition: offset}; a partition left out is read from its newest record."""
    cursor: dict[int, int] = {}
    if raw == "":
        return cursor
    for part in raw.split(","):
        partition_text, sep, offset_text = part.partition(":")
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            partition = offset = -1
        if not sep or not 0 <= partition < partitions or offset < 0 or partition in cursor:
            message = (
                f"query parameter before={raw!r}: expected <partition>:<offset> pairs separated by commas, "
                f"each partition once and from 0 to {partitions - 1}, offsets from 0 (as the page's 'next' gives them)"
            )
            raise ValueError(message)
        cursor[partition] = offset
    return cursor


def format_before(cursor: Mapping[int, int]) -> str:
    return ",".join(f"{partition}:{offset}" for partition, offset in sorted(cursor.items()))


def chunk_start(low: int, start: int, missing: int) -> int:
    """Where the next backwards read of a partition begins: twice the records still missing (markers take offsets)."""
    return max(start, low - max(2 * missing, CHUNK_MIN_OFFSETS))


def entry_time_ms(entry: Mapping[str, Any]) -> int:
    """When a dead letter failed (its ``failed_ms``), else when it was written."""
    failed = entry.get("failed_ms")
    return failed if isinstance(failed, int) and not isinstance(failed, bool) else int(entry["timestamp_ms"])


def merge_newest(windows: Sequence[Window], limit: int) -> Page:
    """The newest ``limit`` dead letters of ``windows``, merged across partitions, and the cursor past them.

    Each partition is taken newest offset first, so what a page takes of a partition is always the top of
    what was left: pages are disjoint and, followed to the end, cover every record. Across partitions the
    merge picks the latest failure time; it stops early when a partition's window is used up but older
    records of it were not read (they might be newer than what the other partitions offer next).
    """
    stacks = {window.partition: list(window.entries) for window in windows}
    taken: list[Entry] = []
    while len(taken) < limit:
        if any(not stacks[window.partition] and window.more_below for window in windows):
            break
        heads = [window.partition for window in windows if stacks[window.partition]]
        if not heads:
            break
        newest = max(heads, key=lambda partition: (entry_time_ms(stacks[partition][-1]), partition))
        taken.append(stacks[newest].pop())
    cursor: dict[int, int] = {}
    for window in windows:
        left = stacks[window.partition]
        # everything read of the partition is taken: the next page starts below what was read
        cursor[window.partition] = int(left[-1]["offset"]) + 1 if left else window.low
    done = all(cursor[window.partition] <= window.start for window in windows)
    return Page(entries=taken, next_before=None if done else cursor)


class DeadLetterReader:
    """One consumer for every page a worker serves, started by the first request and stopped with the worker.

    Assigned (no group), read_committed, paused between pages so it fetches nothing while idle. A lock
    keeps two requests from seeking it at once. ``started`` counts the consumers it has started (one,
    unless a read failed and it had to start afresh).
    """

    def __init__(self, bootstrap: str, client_options: Mapping[str, Any], decode: Decode) -> None:
        self._bootstrap = bootstrap
        self._client_options = dict(client_options)
        self._decode = decode
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned: list[TopicPartition] = []
        self._lock = asyncio.Lock()
        self.started = 0
        self.pages = 0

    async def page(self, topic: str, partitions: int, before: Mapping[int, int], limit: int) -> Page:
        async with self._lock:
            try:
                consumer = await self._ready(topic, partitions)
                windows = await self._read(consumer, before, limit)
            except BaseException:
                await self._close()  # a broken connection or a half-done read: the next page starts afresh
                raise
            self.pages += 1
            return merge_newest(windows, limit)

    async def stop(self) -> None:
        async with self._lock:
            await self._close()

    async def _ready(self, topic: str, partitions: int) -> AIOKafkaConsumer:
        wanted = [TopicPartition(topic, partition) for partition in range(partitions)]
        if self._consumer is not None and self._assigned == wanted:
            return self._consumer
        await self._close()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            group_id=None,
            **self._client_options,
        )
        await consumer.start()
        self._consumer, self._assigned = consumer, wanted
        self.started += 1
        consumer.assign(wanted)  # an unassigned consumer has no metadata for the topic: weir declares its partitions
        consumer.pause(*wanted)
        return consumer

    async def _close(self) -> None:
        consumer, self._consumer, self._assigned = self._consumer, None, []
        if consumer is not None:
            await consumer.stop()

    async def _read(self, consumer: AIOKafkaConsumer, before: Mapping[int, int], limit: int) -> list[Window]:
        starts = await consumer.beginning_offsets(self._assigned)
        ends = await consumer.end_offsets(self._assigned)  # read_committed: the last stable offsets
        windows: dict[TopicPartition, Window] = {}
        for tp in self._assigned:
            high = max(starts[tp], min(ends[tp], before.get(tp.partition, ends[tp])))
            windows[tp] = Window(partition=tp.partition, start=starts[tp], low=high, high=high)
        scan_limit = MAX_SCAN_PER_LIMIT * limit
        deadline = time.monotonic() + READ_TIMEOUT_S
        while True:
            wanted = {
                tp: window
                for tp, window in windows.items()
                if window.more_below and len(window.entries) < limit and window.high - window.low < scan_limit
            }
            if not wanted:
                return list(windows.values())
            ranges = {tp: (chunk_start(window.low, window.start, limit - len(window.entries)), window.low) for tp, window in wanted.items()}
            chunk = await self._read_ranges(consumer, ranges, deadline)
            for tp, window in wanted.items():
                window.entries[:0] = chunk[tp]
                window.low = ranges[tp][0]
                if len(window.entries) > limit:  # only the newest ``limit`` of a partition can be on the page
                    del window.entries[: len(window.entries) - limit]
                    window.low = int(window.entries[0]["offset"])

    async def _read_ranges(
        self, consumer: AIOKafkaConsumer, ranges: Mapping[TopicPartition, tuple[int, int]], deadline: float
    ) -> dict[TopicPartition, list[Entry]]:
        """The records of ``[low, high)`` of each partition, oldest first."""
        found: dict[TopicPartition, list[Entry]] = {tp: [] for tp in ranges}
        for tp, (low, _) in ranges.items():
            consumer.seek(tp, low)
        pending = set(ranges)
        consumer.resume(*pending)
        try:
            while pending:
                if time.monotonic() > deadline:
                    message = f"read of {sorted(str(tp) for tp in pending)} took over {READ_TIMEOUT_S}s"
                    raise TimeoutError(message)
                batch = await consumer.getmany(*pending, timeout_ms=200)
                for tp, messages in batch.items():
                    low, high = ranges[tp]
                    found[tp].extend(
                        self._decode(
                            message.value, topic=tp.topic, partition=tp.partition, offset=message.offset, timestamp_ms=message.timestamp
                        )
                        for message in messages
                        if low <= message.offset < high
                    )
                for tp in list(pending):
                    if await consumer.position(tp) >= ranges[tp][1]:
                        pending.discard(tp)
        finally:
            consumer.pause(*ranges)
        return found
