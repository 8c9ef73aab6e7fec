"""Exactly-once on Faust, made sound: transaction routing by source partition and a fresh local state.

Faust (0.15) implements exactly-once with one transactional producer per assigned source partition
(Kafka's EOS v1). weir runs one per worker by default instead (EOS v2, ``WEIR_TRANSACTIONS=per_worker``,
fenced by the consumer group's generation: :mod:`app.kip447`); with ``per_partition`` it keeps Faust's
layout. Faust's implementation has gaps that lose or duplicate data under a crash:

* it picks the transaction of a send by the *destination* partition (faust-streaming/faust#517), so an
  output to another topic or partition lands in a transaction that commits without the source offset,
  or in none at all; we route every send made while an event is processed to the transaction of that
  event's source partition, which is the one that commits its offset;
* it commits a transaction without draining its own send buffer, where table changelog writes wait, so
  a changelog write could fall into the next transaction; we drain the buffer before every commit;
* it never restores a table partition taken over from a crashed worker (see
  :class:`WeirConsumerThread`);
* it commits on a timer in the middle of events, splitting an event's effects over two transactions
  (see :class:`CommitGate`);
* its RocksDB files keep writes of transactions that later aborted (a SIGKILL between a table write and
  the commit): the restarted worker would skip work it never committed. Like Kafka Streams after an
  unclean shutdown, a worker under exactly_once starts from an empty local store and restores it from
  the committed changelog (see :func:`wipe_local_tables`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import os
import shutil
import socket
import threading
import time
import types
import weakref
from collections.abc import AsyncIterator, Awaitable, Coroutine, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import faust
from aiokafka.errors import CommitFailedError, ProducerFenced
from aiokafka.structs import TopicPartition
from faust.streams import _current_event
from faust.transport.consumer import CONSUMER_FETCHING, TransactionManager, ensure_TP, ensure_TPset
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, EventT, Message
from faust.types.tuples import FutureMessage, RecordMetadata, ack_lock
from faust.utils.functional import consecutive_numbers
from intervaltree import IntervalTree  # type: ignore[import-untyped]
from mode import Service, ServiceT

from app import kip447

__all__ = [
    "WeirTransactionManager",
    "WeirTable",
    "WeirTopic",
    "ack_handled",
    "first_delivery",
    "to_process",
    "batch_scope",
    "event_scope",
    "gate",
    "install",
    "wipe_local_tables",
]

log = logging.getLogger(__name__)

#: WEIR_TRACE_FILE: when set, every event handled and every offset committed is appended there, one line
#: each (a diagnostic for the open takeover defect: which offsets were committed without being handled).
_TRACE_FILE = os.environ.get("WEIR_TRACE_FILE") or None


def tracing() -> bool:
    """Whether ``WEIR_TRACE_FILE`` is set (worth formatting a trace line)."""
    return _TRACE_FILE is not None


def trace(what: str, tp: TP, offset: int) -> None:
    if _TRACE_FILE is not None:
        with open(_TRACE_FILE, "a") as out:
            out.write(f"{time.time():.3f} {os.getpid()} {what} {tp.topic} {tp.partition} {offset}\n")


class WeirTransactionManager(TransactionManager):
    """Faust's transaction manager: one transaction per worker (``WORKER_TRANSACTION``), or one per source
    partition that every send made for that partition's events joins.

    Per worker, the id is ``<app id>-worker-<WEIR_WORKER_ID or worker_slot()>``. Per partition, a
    transactional id is ``<app id>-<n>p-<partition>`` where ``n`` is the topic's partition count: the
    topics one worker consumes, and its tables' changelogs, are co-partitioned (the assignor gives
    partition ``i`` of all of them to the same member), so partition ``i`` of all of them shares one
    transaction, the one that also commits their offsets. Faust's own grouping reads the assignor's
    topic groups, which are empty for a stage without tables (a KeyError on the first send).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._partition_counts: dict[str, int] = {}
        self._worker_id: str | None = None

    def _transactional_id(self, topic: str, partition: int) -> str:
        if WORKER_TRANSACTION is not None:
            # Asked on every send: the host name and the settings lookups cost a few % of a busy worker.
            # Fixed once the first transaction began (the web port is set by then, ``worker_slot``).
            if self._worker_id is None:
                self._worker_id = f"{self.app.conf.id}-worker-{WORKER_TRANSACTION or worker_slot(self.app.conf.web_port)}"
            return self._worker_id
        return f"{self.app.conf.id}-{self._partition_count(topic)}p-{partition}"

    def _partition_count(self, topic: str) -> int:
        """The topic's partition count as the transactional ids use it: the same for a topic all along.

        The consumer's metadata snapshot lists a topic created a moment ago (a changelog on a fresh topic
        set, sometimes a source topic) with 0 partitions, and the two sides of one transaction must not
        disagree: a changelog write routed to "...-4p-0" while its event's outputs and offsets went to
        "...-0p-0" stayed in a transaction nobody committed, and a fresh "...-0p-0" with no producer
        crashed the worker. So an unknown count is the count weir declared the topic (or the changelog's
        table) with, and a count once known is kept. A topic weir did not declare and the snapshot does
        not know (the assignor's leader topic at start) is 0: guessing would name another transaction.
        """
        count = self._partition_counts.get(topic)
        if count is None:
            count = self.app.consumer.topic_partitions(topic) or self._declared_partitions(topic)
            if count:
                self._partition_counts[topic] = count
        return count or 0

    def _declared_partitions(self, topic: str) -> int | None:
        default = int(self.app.conf.topic_partitions)
        for channel in list(self.app.topics):
            if topic in getattr(channel, "topics", ()):
                return int(channel.partitions or default)
        for table in self.app.tables.values():
            if table.changelog_topic_name == topic:
                return int(table.partitions or default)
        return None

    async def _start_transactions(self, tids: Any) -> None:
        # A worker that keeps partitions across a rebalance keeps their producer, its transaction open
        # since the commit before the rebalance (with one transaction per worker, always the case).
        producer = cast(aiokafka_driver.Producer, self.producer)
        for transactional_id in tids:
            running = producer._transaction_producers.get(transactional_id)
            if running is None or not running._txn_manager.is_in_transaction():
                await producer.maybe_begin_transaction(transactional_id)

    def _tps_to_transactional_ids(self, tps: set[TP]) -> set[str]:
        assignor = self.app.assignor
        return {self._transactional_id(tp.topic, tp.partition) for tp in tps if not assignor.is_standby(tp)}

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: Any,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        event = faust.current_event()
        if event is not None:
            source: TP = event.message.tp
            owner = self._transactional_id(source.topic, source.partition)
        else:
            # Buffered table changelog writes (and timer sends) come without an event: they name their
            # partition, which is the source partition's number in a co-partitioned topic.
            destination = self.consumer.key_partition(topic, key, partition)
            owner = self._transactional_id(topic, destination if destination is not None else partition or 0)
        return await self.producer.send(topic, key, value, partition, timestamp, headers, transactional_id=owner)

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        # Inside the commit gate already: WeirConsumer.force_commit closed it before the offsets were chosen.
        began = time.monotonic()
        try:
            return await self._commit(offsets, start_new_transaction)
        finally:
            if _TRACE_FILE is not None:
                took = f"{1000 * (began - gate.commit_asked):.1f}+{1000 * (time.monotonic() - began):.1f}ms"
                trace(f"commit-gate+txn-{took}", TP("-", -1), len(offsets))

    async def _commit(self, offsets: Mapping[TP, int], start_new_transaction: bool) -> bool:
        # Events delivered their own changelog writes (event_scope); a write made outside an event
        # would still wait in Faust's buffer, and belongs to this transaction.
        await self.app.producer.buffer.flush()
        # The batches handled since the last commit left their deliveries to it (batch_scope): a commit
        # never covers an offset whose writes or sends failed.
        # Parts of an older consumer generation are dropped: their transactions ended with the rebalance
        # (their producers were replaced), and their events come again from the committed offset.
        generation = self.app.consumer_generation_id
        deferred = [part for part in _deferred if part[0].message.generation_id == generation]
        _deferred.clear()
        if not await await_deliveries(deferred):
            return False
        by_transaction: dict[str, dict[TP, int]] = {}
        for tp, offset in offsets.items():
            by_transaction.setdefault(self._transactional_id(tp.topic, tp.partition), {})[tp] = offset
        try:
            # One transaction per worker, or one per source partition, each on its own producer, side by side.
            await asyncio.gather(
                *(self._commit_one(txn_id, txn_offsets, start_new_transaction) for txn_id, txn_offsets in by_transaction.items())
            )
        except (ProducerFenced, CommitFailedError) as fenced:
            # Another worker owns these partitions now (per partition: a producer with the same transactional
            # id; per worker: the group refused this member's generation): this one must not go on with stale state.
            log.warning("producer fenced: %s", fenced)
            await self.app.crash(fenced)
        return True

    async def _commit_one(self, transactional_id: str, offsets: Mapping[TP, int], start_new_transaction: bool) -> None:
        # Faust's commit_transactions fails when a transaction is not open (a second commit during
        # shutdown, after one that did not start a new transaction): open one for the offsets then.
        producer = cast(aiokafka_driver.Producer, self.producer)
        async with producer._trn_locks[transactional_id]:
            transaction_producer = producer._transaction_producers.get(transactional_id)
            if transaction_producer is None:
                log.warning("no transaction %s to commit %s in: they will be processed again", transactional_id, offsets)
                return
            if not transaction_producer._txn_manager.is_in_transaction():
                await transaction_producer.begin_transaction()
            await transaction_producer.send_offsets_to_transaction(offsets, self.app.conf.id)
            await transaction_producer.commit_transaction()
            for tp, offset in offsets.items():
                trace("commit", tp, offset)
            if start_new_transaction:
                await transaction_producer.begin_transaction()


class WeirConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    """Faust's consumer thread, asking the broker for the end of a changelog before restoring it.

    Under exactly_once Faust took the "highwater" of a changelog from the last stable offset the
    consumer has *seen in a fetch*: unknown (-1) for a partition just taken over, so recovery read
    nothing and the new owner started from an empty table (completed groups completed again). A
    read_committed consumer's ``end_offsets`` is the last stable offset, from the broker.
    """

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        if STATIC_MEMBER is not None:
            # Static membership (KIP-345): a worker restarted under its instance id within the session timeout
            # gets its partitions back without a rebalance of the group; it does not leave the group on a stop.
            consumer._group_instance_id = STATIC_MEMBER or worker_slot(self.app.conf.web_port)
            log.info("static group membership: instance id %s", consumer._group_instance_id)
        return consumer

    #: seconds a worker waits, before it joins its group, for the broker to list every topic it subscribes to
    TOPICS_VISIBLE_WITHIN_S = 15.0

    async def subscribe(self, topics: Any) -> None:
        """Join only once the broker lists every subscribed topic (changelogs a worker creates as it starts).

        The group's leader assigns the partitions its metadata knows: a changelog topic created a moment
        before the join (by this worker or a peer) was missing from it, and the first assignment had no
        partition of it. A dynamic group mends that at its next rebalance; a static member restarted in
        place gets the stored assignment back without one, so a restarted worker owned no partition of
        its table, restored nothing and refused a payment commit for "no capture" (the 2,000-order chaos
        run with static members, 22 captures never committed).
        """
        topics = set(topics)
        await self.call_thread(self._until_listed, topics)  # the client belongs to the consumer thread's loop
        await super().subscribe(topics)

    async def _until_listed(self, topics: set[str]) -> None:
        client = self._ensure_consumer()._client
        missing = await until_listed(client, topics, self.TOPICS_VISIBLE_WITHIN_S)
        if missing:
            log.warning("joining without topics the broker does not list yet: %s", missing)

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        consumer = self._ensure_consumer()
        if WORKER_TRANSACTION is not None:
            # One transaction per worker: the changelog's previous owner may have left one open (killed), or
            # its commit markers may still be on their way here after its offsets became stable.
            await kip447.wait_settled(consumer, partitions)
        return cast(Mapping[TP, int], await consumer.end_offsets(partitions))


class WeirProducer(aiokafka_driver.Producer):
    """Faust's producer; with one transaction per worker, its transactional producer commits offsets with the
    consumer group's generation (KIP-447, :mod:`app.kip447`) and a transaction timeout of weir's choosing."""

    def _settings_extra(self) -> Mapping[str, Any]:
        extra = dict(super()._settings_extra())
        if WORKER_TRANSACTION is not None and self.app.in_transaction:
            extra["transaction_timeout_ms"] = TRANSACTION_TIMEOUT_MS
        return extra

    def _new_producer(self, transactional_id: str | None = None) -> Any:
        producer = super()._new_producer(transactional_id=transactional_id)
        if transactional_id is not None and WORKER_TRANSACTION is not None:
            log.info("exactly_once: this worker's transactions run under transactional id %s", transactional_id)
            kip447.attach_group_member(producer, self._group_member, group_id=self.app.conf.id)
        return producer

    def _group_member(self) -> kip447.GroupMember:
        """The consumer's generation and member id now (read from the consumer thread's coordinator)."""
        coordinator = cast(Any, self.app.consumer)._thread._ensure_consumer()._coordinator
        return coordinator.generation, coordinator.member_id, coordinator._group_instance_id


class SkippedOffsets:
    """Per partition, the offsets aiokafka's fetcher stepped over itself: transaction markers, aborted records.

    A read_committed fetch returns no record for a transaction marker or an aborted transaction's records:
    a hole between the offset a fetch started at (or its previous record) and its next record is the
    fetcher's own doing, and legitimate. A hole that no fetch stepped over is not: the fetch position
    moved past records nobody delivered (seen after takeovers; once it lost a single record that a
    one-offset rule took for a transaction marker). ``aiokafka``'s ``PartitionRecords`` is wrapped
    (:func:`install`) to note each stepped-over range as its records are read; the delivery loop believes
    a hole only when it is covered, and fetches again from the expected offset otherwise.
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


def _note_skipped_offsets() -> None:
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


def _client(consumer: Any) -> Any:
    """The aiokafka consumer behind a Faust consumer's thread (None: not started)."""
    return getattr(getattr(consumer, "_thread", None), "_consumer", None)


def _assignment(consumer: Any) -> Any:
    """aiokafka's current assignment of a Faust consumer's client (None: not started, or between assignments)."""
    client = _client(consumer)
    try:
        return client._subscription.subscription.assignment if client is not None else None
    except AttributeError:
        return None


def _position(assignment: Any, tp: TP) -> int | None:
    """The fetch position of ``tp`` in an aiokafka assignment (None: not assigned, or no position yet)."""
    try:
        state = assignment.state_value(tp)
        return int(state.position) if state is not None and state.has_valid_position else None
    except (KeyError, AssertionError, AttributeError):  # revoked or being reset meanwhile
        return None


def _fetch_position(app: Any, tp: TP) -> int | None:
    """The consumer's fetch position of ``tp`` now (None: not assigned, or no position yet)."""
    assignment = _assignment(app.consumer)
    return None if assignment is None else _position(assignment, tp)


def _end_restores_at_markers() -> None:
    """Make Faust's recovery see that a changelog partition whose tail is transaction markers is restored.

    Recovery ends a partition's restore once it has seen the record at its "highwater" (end offset - 1).
    Under transactions the last offset of a changelog is a commit (or abort) marker, which no fetch
    returns: Faust waited for two 5-second timeouts of its changelog queue before it looked at the fetch
    position ("Aborted tx until highwater"), so every restore of a non-empty changelog, at every
    rebalance and every restart, took 10 s more. Here a partition is restored as soon as the fetch
    position is past its highwater and every offset after the last record recovery saw was stepped over
    by the fetcher itself (:class:`SkippedOffsets`: markers, aborted records): no record is on its way.
    """
    from faust.tables.recovery import Recovery

    if getattr(Recovery, "_weir_ends_at_markers", False):
        return
    original: Any = Recovery.need_recovery

    def need_recovery(self: Any) -> bool:
        if self.app.in_transaction:
            offsets = self.active_offsets
            for tp, highwater in list(self.active_highwaters.items()):
                seen = offsets.get(tp)
                if highwater is None or seen is None or seen >= highwater:
                    continue
                position = _fetch_position(self.app, tp)
                if position is not None and position > highwater and skipped_offsets.covers(tp.topic, tp.partition, seen + 1, position):
                    offsets[tp] = highwater  # what Faust's own "Aborted tx until highwater" sets, 10 s later
        return bool(original(self))

    Recovery.need_recovery = need_recovery  # type: ignore[method-assign]
    Recovery._weir_ends_at_markers = True  # type: ignore[attr-defined]


class WeirConsumer(aiokafka_driver.Consumer):
    """Faust's consumer with a delivery loop that never skips a record and never acks a stale one.

    Faust's loop (``Consumer._drain_messages``) hands records to the agents one by one from a batch
    fetched earlier. Three of its shortcuts commit offsets past records no agent handled:

    * a batch fetched before a seek or a rebalance is still delivered after it; every record of it
      moves the read offset forward, and the copies re-fetched from the sought position are then
      dropped as already read;
    * records of a partition paused meanwhile are dropped, though the fetch position is past them;
    * a stream skips an event of an older generation *and acks it*, so the offset of a record the new
      owner never handled lands among the acked ones; the commit then covers it. The head of the acked
      list may also miss the committed offset itself (Faust tolerates a one-offset hole there).

    Here every batch carries the *epoch* in which its fetch started; a seek, a rebalance or a flow stop
    moves the epoch, and the rest of a batch from an older epoch is thrown away after rewinding the
    fetch position of its partitions to the next offset not yet delivered (``_next``). Records of a
    partition that is not active are not delivered and that partition is rewound the same way. An
    offset missing between the committed or last delivered offset and the next record of a current
    batch is a gap the commit may cover only when a fetch stepped over it (a transaction marker, an
    aborted record: :class:`SkippedOffsets`); any other hole is fetched again from the expected offset.
    Acks of an older generation are ignored: that record comes again from the committed offset. An
    event delivered twice in one generation (Faust's seeks) is processed once (:func:`first_delivery`).
    """

    _weir_epoch = 0

    def _new_consumer_thread(self) -> aiokafka_driver.AIOKafkaConsumerThread:
        return WeirConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        """Under exactly_once, the commit gate closes before the offsets to commit are chosen.

        Faust chooses them first (the acked events), then commits the transaction. The gate waits for the
        events still in flight, which finish inside the transaction: their outputs and changelog writes
        were committed, their offsets only by the next commit. A crash in between replayed them and sent
        their outputs a second time (``tests/integration/test_commit_boundary.py``). Once the gate is closed
        and idle, every event the transaction holds was acked before the offsets are chosen.
        """
        if not self.in_transaction:
            return cast(bool, await super().force_commit(topics, start_new_transaction))
        async with gate.committing():
            return cast(bool, await super().force_commit(topics, start_new_transaction))

    @property
    def _next(self) -> dict[TP, int]:
        """Per stream partition: the next offset to deliver (the sought or committed one, then the last delivered + 1)."""
        try:
            return cast(dict[TP, int], self.__dict__["_weir_next"])
        except KeyError:
            self.__dict__["_weir_next"] = {}
            return cast(dict[TP, int], self.__dict__["_weir_next"])

    def _moved(self) -> None:
        self._weir_epoch += 1

    def stop_flow(self) -> None:
        self._moved()
        super().stop_flow()

    def pause_partitions(self, tps: Any) -> None:
        tps = ensure_TPset(tps)
        super().pause_partitions(tps)
        self._fetch_changelogs(tps, fetch=False)

    def resume_partitions(self, tps: Any) -> None:
        tps = ensure_TPset(tps)
        super().resume_partitions(tps)
        self._fetch_changelogs(tps, fetch=True)

    def _fetch_changelogs(self, tps: set[TP], *, fetch: bool) -> None:
        """Pause (or resume) a table's changelog partitions in aiokafka's fetcher too, not only in Faust's books.

        Faust pauses a partition by leaving it out of the partitions it asks its client for; aiokafka's
        fetcher went on fetching every assigned partition. A changelog partition is read by recovery only,
        so its records, once fetched after recovery (the worker's own table writes), were never consumed:
        they sat in the fetcher's buffer, and while a partition's records wait there (up to aiokafka's
        100 ms prefetch backoff) the fetcher sends no fetch to that broker at all. With one broker that
        stalled every partition for 100 ms at each changelog partition's first write after an assignment
        (a light load's slowest orders). Stream partitions keep Faust's own flow control. A fetch already on
        its way when a partition is paused may still bring records of it: one such stall, not one per write.
        """
        wanted = [TopicPartition(tp.topic, tp.partition) for tp in tps if self._is_changelog_tp(tp)]
        client = _client(self)
        if wanted and client is not None:
            # aiokafka's partition state belongs to the consumer thread's loop (a resume sets a future there)
            cast(Any, self)._thread.thread_loop.call_soon_threadsafe(set_fetching, client, wanted, fetch)

    async def seek(self, partition: TP, offset: int) -> None:
        self._moved()
        self._next[partition] = offset
        await super().seek(partition, offset)

    async def perform_seek(self) -> None:
        self._moved()
        committed = await self.seek_to_committed()
        positions = self._next
        acks_enabled_for = self.app.topics.acks_enabled_for
        for tp, offset in committed.items():
            if acks_enabled_for(tp.topic):  # changelog positions belong to recovery, which seeks them itself
                # no committed offset: the consumer starts from the beginning (auto_offset_reset="earliest")
                start = offset if offset is not None and offset >= 0 else 0
                positions[ensure_TP(tp)] = self._after_handled(ensure_TP(tp), start)
                trace(f"seek-from-{start}", ensure_TP(tp), positions[ensure_TP(tp)])
        self._read_offset.update({tp: offset if offset is not None and offset >= 0 else None for tp, offset in committed.items()})
        self._committed_offset.update({ensure_TP(tp): offset if offset else None for tp, offset in committed.items() if offset is not None})

    def _after_handled(self, tp: TP, start: int) -> int:
        """The first offset from ``start`` that was not handled in this generation (nor a gap between handled ones).

        Faust seeks the stream partitions to their committed offsets more than once in a generation (at the
        end of recovery, and whenever it fetches while the flow is stopped). An event handled since the last
        commit has its outputs and table writes in the open transaction, which commits with its offset:
        delivering it again sent its outputs twice (an invalid order's outcome twice in the all-stages crash
        loop). Handled offsets, acked and not committed yet (a rebalance clears them), are not delivered
        again; the first offset not handled is.
        """
        handled = set(self._acked.get(tp, ()))
        gaps: IntervalTree | None = self._gap.get(tp)
        position = start
        while position in handled or (gaps is not None and gaps.overlaps(position)):
            position += 1
        return position

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._moved()
        if revoked and self.in_transaction:
            await self._commit_before_rebalance()
        for tp in revoked:
            self._next.pop(tp, None)
        await super().on_partitions_revoked(revoked)

    async def _commit_before_rebalance(self) -> None:
        """Under exactly_once, commit what was handled before a rebalance takes the partitions (as Kafka Streams does).

        Faust did not: the open transaction of a partition the worker keeps went on across the rebalance,
        the events it covered were read again from the committed offset, and Faust's recovery re-applied
        the changelog up to the last stable offset (it never records the persisted offset under
        exactly_once: ``persist_offset_on_commit`` is keyed by changelog partition, ``on_commit`` looks it
        up by source partition), reverting the table to its last committed values. The events then ran
        again on old state and sent their outputs a second time into the same transaction: two
        ``committed`` payment records for one order in the 2,000-order chaos run. Committing first leaves
        nothing handled and uncommitted: the changelog's stable offset covers every write, and the
        committed offsets every handled event. From here until the assignment, events are not processed
        (``CommitGate.hold``); the commit waits for the ones in flight (``CommitGate``).
        """
        self.stop_flow()
        self.app.flow_control.suspend()
        gate.hold()
        try:
            # commit() returns without committing when another commit is running (the timer's): that one
            # may not cover the last events handled, so wait for it, then commit for certain
            await self.maybe_wait_for_commit_to_finish()
            await self.force_commit()
        except Exception as error:
            # The handled events' table writes are in the local store, their transaction will not commit:
            # processing them again on top of that store would lose their outputs. A restarted worker
            # rebuilds its store from the committed changelog (wipe_local_tables).
            log.error("commit before a rebalance failed, stopping: %r", error)
            await self.app.crash(error)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self._moved()
        try:
            await super().on_partitions_assigned(assigned, generation_id)
        finally:
            gate.release()  # the new generation is set: events of the old one are told apart by it

    @property
    def _handled(self) -> set[tuple[TP, int, int | None]]:
        """Messages an agent finished (``ack_handled``): the only acks that count toward a commit."""
        try:
            return cast(set[tuple[TP, int, int | None]], self.__dict__["_weir_handled"])
        except KeyError:
            self.__dict__["_weir_handled"] = set()
            return cast(set[tuple[TP, int, int | None]], self.__dict__["_weir_handled"])

    def mark_handled(self, message: Message) -> None:
        self._handled.add((message.tp, message.offset, message.generation_id))
        self._weir_uncommitted += 1
        self._weir_work.set()

    _weir_uncommitted = 0

    @property
    def _weir_work(self) -> asyncio.Event:
        """Set when an event was handled since the commit handler last looked (it sleeps on it while idle)."""
        if "_weir_work_event" not in self.__dict__:
            self.__dict__["_weir_work_event"] = asyncio.Event()
        return cast(asyncio.Event, self.__dict__["_weir_work_event"])

    @Service.task
    async def _commit_handler(self) -> None:
        """Commit as soon as the worker is idle, and at least every ``commit_interval`` while it is busy.

        A fixed interval makes every hop of a pipeline wait half an interval on average for its
        transaction to commit (a read_committed reader sees nothing before). Here a worker that has
        handled events commits once no event has been in flight for ``COMMIT_IDLE_S``: under a light
        load each batch commits right away; under a steady load the gate is rarely idle that long and
        commits come every ``commit_interval``, as in Faust. ``COMMIT_IDLE_S`` = 0: Faust's fixed timer.
        The handler sleeps on events (work handled, the gate going idle), not on a polling timer: a
        commit starts ``COMMIT_IDLE_S`` after the last batch ended, not up to half of it later.

        A commit holds every batch back while it runs (a few broker round trips, per source partition
        under ``per_partition``).
        Under a moderate load the gate is idle often, and committing at each pause spent most of the time
        committing: a worker offered 150 orders/s fell behind. So once commits took more than a third of
        the last second, a commit started by a pause comes at least ``COMMIT_SPACING`` times their
        average duration after the last one (:class:`CommitBudget`), and a hop's latency stays a few commit
        durations. Under a light load commits are not spaced: a slow commit (20-30 ms now and then) made
        the next one wait twice as long, the tail of the light-load latency.
        """
        interval = self.commit_interval
        idle_s = COMMIT_IDLE_S
        await self.sleep(interval)
        if not idle_s:
            async for _ in self.itertimer(interval, name="commit"):
                await self.commit()
            return
        work = self._weir_work
        budget = CommitBudget(COMMIT_SPACING)
        last = spare_at = time.monotonic()
        while not self.should_stop:
            now = time.monotonic()
            if not self._weir_uncommitted:
                work.clear()
                await self.wait_for_stopped(work, timeout=interval)  # type: ignore[arg-type]  # mode waits on any .wait()
                if not self._weir_uncommitted:
                    last = time.monotonic()
                continue
            idle = gate.idle_for()
            if now - last >= interval or (idle >= idle_s and now >= spare_at):
                self._weir_uncommitted = 0
                began = time.monotonic()
                await self.commit()
                last = time.monotonic()
                spare_at = budget.next_commit_at(began, last)
            elif idle > 0:
                wake_at = min(max(now + idle_s - idle, spare_at), last + interval)
                await asyncio.sleep(max(0.0, wake_at - now))
            else:
                await self.wait_for_stopped(gate.idle_event, timeout=max(0.0, interval - (now - last)))  # type: ignore[arg-type]

    def ack(self, message: Message) -> bool:
        # A stream acks the events it skips (an older generation, or flow control off during a rebalance)
        # as if done: counted, the commit would cover records no agent processed. They come again from
        # the committed offset after the rebalance's seek.
        key = (message.tp, message.offset, message.generation_id)
        if key not in self._handled or message.generation_id != self.app.consumer_generation_id:
            self._handled.discard(key)
            with ack_lock:
                message.acked = True
                self._unacked_messages.discard(message)
            return False
        self._handled.discard(key)
        acked: bool = super().ack(message)
        return acked

    def _new_offset(self, tp: TP) -> int | None:
        acked = self._acked[tp]
        if not acked:
            return None
        max_offset = max(acked)
        gaps: IntervalTree = self._gap[tp]
        if gaps:
            covered = sorted(gaps.overlap(0, max_offset + 1), key=lambda interval: interval.begin)
            filled = [offset for interval in covered for offset in range(interval.begin, interval.end)]
            if filled:
                gaps.chop(0, max(filled[-1], max_offset) + 1)
                index = self._acked_index[tp]
                for offset in filled:
                    if offset not in index:
                        index.add(offset)
                        acked.append(offset)
        acked.sort()
        committed = self._committed_offset[tp]
        if committed is not None:
            while acked and acked[0] < committed:  # committed already
                self._acked_index[tp].discard(acked.pop(0))
            if not acked or acked[0] != committed:
                return None  # the record at the committed offset is not done yet
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1

    async def _rewind(self, firsts: Mapping[TP, int]) -> None:
        """Seek the partitions of an abandoned batch back to the next offset not yet delivered.

        ``firsts`` holds each partition's first offset in the batch: the fetch position before it, for a
        partition with nothing delivered or sought since. Always right: a seek since the batch was fetched
        set the offset to its target, and a batch fetched after such a seek has moved the fetch position
        past records now thrown away (a table's changelog being restored too: recovery must see them).
        """
        assigned = self.assignment()
        for tp, first in firsts.items():
            target = self._next.get(tp, first)
            if tp not in assigned:
                continue  # revoked meanwhile: its owner starts from the committed offset
            try:
                await self._seek(tp, target)
            except Exception as exc:
                log.info("rewind of %s to %s skipped: %r", tp, target, exc)

    #: seconds a fetch position may stay ahead of the next offset to deliver before the partition is rewound
    STUCK_AFTER_S = 2.0

    async def _watch_fetch_positions(self) -> None:
        """Rewind a partition whose fetch position stays ahead of what was delivered, with no batch in hand.

        Between batches every fetched record has been delivered, so a fetch position past the next offset
        to deliver means records were consumed from the client and dropped (seen around a takeover: the
        records after the last delivered one never came again). Offsets the fetcher stepped over itself
        (:class:`SkippedOffsets`: transaction markers, aborted records) are not such a gap.
        """
        now = time.monotonic()
        if now - self.__dict__.get("_weir_watched", 0.0) < self.STUCK_AFTER_S / 2:
            return
        self.__dict__["_weir_watched"] = now
        watch: dict[TP, tuple[int, int, float]] = self.__dict__.setdefault("_weir_watch", {})
        assignment = _assignment(self)
        if assignment is None:
            return
        acks_enabled_for = self.app.topics.acks_enabled_for
        for tp, next_offset in list(self._next.items()):
            position = _position(assignment, tp) if acks_enabled_for(tp.topic) else None
            if position is None or position <= next_offset or skipped_offsets.covers(tp.topic, tp.partition, next_offset, position):
                # nothing ahead, or only what the fetcher stepped over itself: transaction markers and aborted
                # records at the end of the partition (a rewind would only step over them again, and kept a
                # changelog's recovery from seeing its position reach the end: Faust looks every 5 s)
                watch.pop(tp, None)
                continue
            seen = watch.get(tp)
            if seen is None or seen[:2] != (next_offset, position):
                watch[tp] = (next_offset, position, now)
            elif now - seen[2] >= self.STUCK_AFTER_S:
                if position - next_offset > 1:
                    log.info("%s: fetched up to %s but delivered up to %s; fetching again", tp, position - 1, next_offset - 1)
                watch.pop(tp, None)
                await self._rewind({tp: next_offset})

    async def _deliver(self, delivery: Any) -> bool:
        """Run the conductor's callback for one record; False if the flow stopped before it was delivered.

        Faust races every record's delivery against ``suspend_flow`` with ``wait_first``: four tasks made
        and cancelled per record, a tenth of a busy worker's time. The callback almost never waits (it
        puts the event in a queue with room), so it is first run here up to its first suspension; only a
        callback that does wait (flow control, a full queue, the producer's buffer) goes on as a task
        raced against ``suspend_flow``, as in Faust.
        """
        try:
            pending = delivery.send(None)
        except StopIteration:
            return True
        task = asyncio.ensure_future(_go_on(delivery, pending))
        outcome = await self.wait_first(task, self.suspend_flow.wait())
        if task in outcome.done:
            return True
        task.cancel()
        return False

    async def _drain_messages(self, fetcher: ServiceT) -> None:
        callback = self.callback
        consumer_stopped = cast(Service, self)._stopped.is_set
        fetcher_stopped = cast(Service, fetcher)._stopped.is_set
        positions = self._next
        committed_offsets = self._committed_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        # Table changelogs are read by recovery, which seeks them itself (from the persisted offset, past a
        # compacted start): their holes are not checked against the stream's committed offsets.
        changelogs = frozenset(self.app.tables.changelog_topics)
        commit_every = self._commit_every
        since_yield = 0
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                await self._watch_fetch_positions()
                epoch = self._weir_epoch
                records, active = await self._wait_next_records(1.0)
                await self.sleep(0)
                if not records or self.should_stop:
                    continue
                generation = self.app.consumer_generation_id
                firsts = {tp: batch[0].offset for tp, batch in records.items() if batch}
                if _TRACE_FILE is not None:
                    for tp, first in firsts.items():
                        trace("fetched", tp, first)
                inactive: set[TP] = set()
                for tp, record in self.scheduler.iterate(records):
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    if epoch != self._weir_epoch or not self.flow_active or generation != self.app.consumer_generation_id:
                        await self._rewind(firsts)
                        break
                    if tp in inactive:
                        continue
                    if active is not None and tp not in active and tp not in self._buffered_partitions:
                        inactive.add(tp)
                        await self._rewind({tp: record.offset})
                        continue
                    offset = record.offset
                    expected = positions.get(tp)
                    if expected is not None and offset < expected:
                        continue  # delivered before
                    if acks_enabled_for(tp.topic) and tp.topic not in changelogs:
                        expected = expected if expected is not None else committed_offsets.get(tp)
                        if expected is not None and offset > expected:
                            if not skipped_offsets.covers(tp.topic, tp.partition, expected, offset):
                                # No fetch stepped over these offsets (markers, aborted records): the fetch
                                # position moved past records nobody delivered. Fetch this partition again
                                # from the expected offset; the batch goes on with the others.
                                log.warning("%s: offsets %s..%s were skipped by a fetch; fetched again", tp, expected, offset - 1)
                                trace(f"refetch-to-{offset}", tp, expected)
                                positions[tp] = expected
                                inactive.add(tp)
                                await self._rewind({tp: expected})
                                continue
                            trace(f"gap-to-{offset}", tp, expected)
                            self._gap[tp].addi(expected, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                    before = positions.get(tp)
                    if not await self._deliver(callback(self._to_message(tp, record))):
                        firsts[tp] = offset
                        await self._rewind(firsts)  # not delivered: the flow stopped
                        break
                    if positions.get(tp) == before:  # unless a seek moved it meanwhile
                        positions[tp] = offset + 1
                    if epoch != self._weir_epoch:
                        # delivered while a seek or a rebalance happened: the stream skips it (older
                        # generation) or it comes again from the sought position
                        await self._rewind(firsts)
                        break
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


@types.coroutine
def _resume(coroutine: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """Go on with a coroutine that was run by hand up to its first suspension on ``pending`` (``yield from``'s protocol)."""
    value = pending
    try:
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:
                value = coroutine.throw(error)
            else:
                value = coroutine.send(sent)
    except StopIteration as stop:
        return stop.value


async def _go_on(coroutine: Coroutine[Any, Any, Any], pending: Any) -> Any:
    return await _resume(coroutine, pending)


class CommitBudget:
    """When a commit started by a pause may follow the last one (``WeirConsumer._commit_handler``).

    At once while the commits of the last ``window_s`` took at most ``1 / (1 + spacing)`` of it (a light
    load); otherwise ``spacing`` times their average duration after it, so that commits take at most that
    share of the time under a moderate load. The average, not the last commit's duration: one slow commit
    (40 ms among commits of 2-3 ms) held the next one back by 80 ms, the tail of the barrier's release
    latency at 30 releases/s (p99 about 190 ms in most runs).
    """

    def __init__(self, spacing: float, window_s: float = 1.0) -> None:
        self.spacing = spacing
        self.window_s = window_s
        self._recent: collections.deque[tuple[float, float]] = collections.deque()  # (ended, duration)

    def next_commit_at(self, began: float, ended: float) -> float:
        recent = self._recent
        recent.append((ended, ended - began))
        while recent and recent[0][0] < ended - self.window_s:
            recent.popleft()
        spent = sum(duration for _, duration in recent)
        if spent <= self.window_s / (1 + self.spacing):
            return ended
        return ended + self.spacing * spent / len(recent)


class CommitGate:
    """Commits happen between events, never in the middle of one.

    Faust commits on a timer while agents keep processing. Under exactly_once that splits an event's
    effects across two transactions: the changelog write of a table update in one, the result it sent
    in the next; a crash between them commits half of the event (a completed group whose result is
    never sent, or an offset committed without its state). Every event is processed, its changelog
    writes made and its offset acked inside :meth:`processing` (their delivery is awaited there or by
    the commit, :func:`batch_scope`); a commit waits in
    :meth:`committing` until no event is in flight and holds new ones back until it is done.
    """

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._idle_since = time.monotonic()
        self._open = asyncio.Event()
        self._open.set()
        self._held = False
        #: When the running (or last) commit asked for the gate.
        self.commit_asked = 0.0

    def hold(self) -> None:
        """A rebalance began: until :meth:`release` (the new generation is set) events are not processed.

        Between the revocation and the assignment the consumer generation does not change yet, so an
        event delivered before the flow stopped still looks current: processed then, its table writes
        would reach the local store in a transaction the rebalance may end. Such events are acked
        without being processed (:attr:`holding`; an ack of an unprocessed event never counts toward a
        commit) and come again from the committed offset. They are not kept waiting: Faust's revocation
        waits until every delivered event is acked (a held batch deadlocked the rebalance).
        """
        self._held = True

    def release(self) -> None:
        self._held = False

    @property
    def holding(self) -> bool:
        """Whether a rebalance is between its revocation and its assignment (see :meth:`hold`)."""
        return self._held

    @contextlib.asynccontextmanager
    async def processing(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()
                self._idle_since = time.monotonic()

    @property
    def idle_event(self) -> asyncio.Event:
        """Set while no event or batch is being processed."""
        return self._idle

    def idle_for(self) -> float:
        """Seconds since the last event or batch finished, 0 while one is being processed."""
        return 0.0 if self._active else time.monotonic() - self._idle_since

    @contextlib.asynccontextmanager
    async def committing(self) -> AsyncIterator[None]:
        self.commit_asked = time.monotonic()  # the trace line of the commit counts its wait here from it
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(asyncio.shield(self._idle.wait()), timeout=10.0)
            except TimeoutError:
                log.warning("commit waits for %d event(s) still being processed", self._active)
                await self._idle.wait()
            yield
        finally:
            self._open.set()


gate = CommitGate()
#: What the current scope sent (table changelog writes and topic sends): delivered before it ends.
_scope_sends: contextvars.ContextVar[list[FutureMessage] | None] = contextvars.ContextVar("weir_scope_sends", default=None)
#: The current scope's table writes, per table: written (store and changelog) once per key when it ends.
_scope_writes: contextvars.ContextVar[dict[int, _Writes] | None] = contextvars.ContextVar("weir_scope_writes", default=None)
_DELETED: Any = object()


class _Writes:
    """One table's reads and writes inside one scope: the last value of each key wins."""

    __slots__ = ("reads", "table", "writes")

    def __init__(self, table: WeirTable) -> None:
        self.table = table
        self.reads: dict[Any, Any] = {}
        self.writes: dict[Any, Any] = {}


class WeirTable(faust.Table[Any, Any]):  # type: ignore[misc]
    """A Faust table that writes once per key per scope, and whose writes the scope waits for.

    Inside :func:`event_scope` (one event, or one partition's part of a batch) reads and writes go to a
    scope-local overlay: a key read twice is read from RocksDB once, a key written ten times is written
    (store and changelog record) once, when the scope's work is done and before its deliveries are
    awaited. Iterating the table writes the overlay out first. Outside a scope it is Faust's table.
    """

    def _writes(self) -> _Writes | None:
        scopes = _scope_writes.get()
        if scopes is None:
            return None
        writes = scopes.get(id(self))
        if writes is None:
            writes = scopes[id(self)] = _Writes(self)
        return writes

    def __getitem__(self, key: Any) -> Any:
        overlay = self._writes()
        if overlay is None:
            return super().__getitem__(key)
        for layer in (overlay.writes, overlay.reads):
            if key in layer:
                value = layer[key]
                if value is _DELETED:
                    return self.__missing__(key)
                return value
        try:
            value = super().__getitem__(key)
        except KeyError:
            overlay.reads[key] = _DELETED
            raise
        overlay.reads[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        overlay = self._writes()
        if overlay is None:
            return super().__contains__(key)
        for layer in (overlay.writes, overlay.reads):
            if key in layer:
                return layer[key] is not _DELETED
        return super().__contains__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        overlay = self._writes()
        if overlay is None:
            super().__setitem__(key, value)
        else:
            overlay.writes[key] = value

    def __delitem__(self, key: Any) -> None:
        overlay = self._writes()
        if overlay is None:
            super().__delitem__(key)
            return
        if key not in self:
            raise KeyError(key)
        overlay.writes[key] = _DELETED

    def write_out(self) -> None:
        """Write the current scope's pending writes of this table now (store and changelog)."""
        scopes = _scope_writes.get()
        overlay = None if scopes is None else scopes.pop(id(self), None)
        if overlay is None:
            return
        for key, value in overlay.writes.items():
            if value is not _DELETED:
                faust.Table.__setitem__(self, key, value)
            elif faust.Table.__contains__(self, key):
                faust.Table.__delitem__(self, key)

    def __iter__(self) -> Any:
        self.write_out()
        return super().__iter__()

    def __len__(self) -> int:
        self.write_out()
        return super().__len__()

    def items(self) -> Any:
        self.write_out()
        return super().items()

    def keys(self) -> Any:
        self.write_out()
        return super().keys()

    def values(self) -> Any:
        self.write_out()
        return super().values()

    def _verify_source_topic_partitions(self, source_topic: str) -> None:
        # Faust compares partition counts from the consumer's metadata snapshot, where a changelog topic
        # created a moment ago may still have 0 partitions: it raised PartitionsMismatch on the first
        # events of a fresh topic set, and those events were dead-lettered. 0 means not known yet.
        consumer = self.app.consumer
        if not consumer.topic_partitions(self.changelog_topic_name) or not consumer.topic_partitions(source_topic):
            return
        super()._verify_source_topic_partitions(source_topic)

    def send_changelog(self, *args: Any, **kwargs: Any) -> FutureMessage:
        sent: FutureMessage = super().send_changelog(*args, **kwargs)
        pending = _scope_sends.get()
        if pending is not None:
            pending.append(sent)
        return sent


class WeirTopic(faust.Topic):  # type: ignore[misc]
    """A Faust topic whose sends inside :func:`event_scope` are delivered before a commit covers them.

    An agent can send without awaiting each delivery: the scope collects them, and they are awaited once,
    at the end of the batch (at_least_once) or by the next commit (exactly_once, :func:`batch_scope`).
    """

    async def _get_producer(self) -> Any:
        """The producer to send with, without a trip around the event loop.

        Faust asks ``app.maybe_start_producer()``, a mode ``stampede`` wrapper that runs ``asyncio.sleep(0)``
        three times per call: every send and changelog write yielded the loop three times, a few
        milliseconds per send under load (a 2-chunk item batch took 3 ms, almost all of it in sends).
        Under exactly_once the producer is the consumer's transaction manager, and otherwise the app's
        producer, started with the app; only a producer not started yet goes through Faust's way.
        """
        app = self.app
        if app.in_transaction:
            return app.consumer.transactions
        producer = app.producer
        if producer.started:
            return producer
        return await super()._get_producer()

    async def publish_message(self, fut: FutureMessage, wait: bool = False) -> Awaitable[RecordMetadata]:
        result = await super().publish_message(fut, wait=wait)
        pending = _scope_sends.get()
        if pending is not None and not wait:
            pending.append(fut)
        return result


#: Set by install() from WEIR_TRANSACTIONS=per_worker: the suffix of this worker's one transactional id (None:
#: one transaction per source partition).
WORKER_TRANSACTION: str | None = None
#: Set by install() from WEIR_STATIC_MEMBERSHIP: this worker's group instance id ("": worker_slot(); None: a
#: dynamic member).
STATIC_MEMBER: str | None = None
#: Set by install() from WEIR_TRANSACTION_TIMEOUT_MS: the transaction timeout of a per-worker transaction.
TRANSACTION_TIMEOUT_MS = 10_000
#: Set by app.core from WEIR_COMMIT_IDLE_MS: commit once no event has been processed for this long (0: fixed interval).
COMMIT_IDLE_S = 0.0
#: A commit started by a pause comes at least this many times the recent commits' average duration after the last one (_commit_handler).
COMMIT_SPACING = 2.0
#: Set by app.core under exactly_once: a batch's deliveries are awaited by the commit, not by the batch (batch_scope).
DEFER_DELIVERIES = False
#: The parts handled since the last commit whose deliveries nobody awaited yet (DEFER_DELIVERIES).
_deferred: list[tuple[EventT[bytes], list[FutureMessage]]] = []
#: How long a scope waits for its table changelog writes and sends to be delivered before the worker gives up.
DELIVERY_TIMEOUT_S = 30.0


def _write_out_tables() -> None:
    scopes = _scope_writes.get()
    while scopes:
        next(iter(scopes.values())).table.write_out()


class BatchScope:
    """The parts of one batch handled inside :func:`batch_scope`, with what each of them sent."""

    def __init__(self) -> None:
        self.handled: list[tuple[EventT[bytes], list[FutureMessage]]] = []

    @contextlib.contextmanager
    def part(self, event: EventT[bytes]) -> Iterator[None]:
        """One partition's part (``event`` is its last) or one event, in :func:`part_scope`."""
        pending: list[FutureMessage] = []
        with part_scope(event, pending):
            yield
        self.handled.append((event, pending))


@contextlib.asynccontextmanager
async def batch_scope() -> AsyncIterator[BatchScope]:
    """Handle a batch between commits: its parts (``scope.part(event)``), then all their deliveries awaited at once.

    Under exactly_once (:data:`DEFER_DELIVERIES`) the deliveries are awaited by the next commit instead,
    before its transactions commit (:meth:`WeirTransactionManager._commit`): the batch's sends and the
    offsets it acked commit together or not at all, so the batch need not wait for the broker's acks. The
    worker goes on with the next batch while they are in flight, instead of one round trip (two, with the
    transaction's AddPartitionsToTxn) per batch.
    """
    async with gate.processing():
        scope = BatchScope()
        yield scope
        if DEFER_DELIVERIES:
            _deferred.extend(part for part in scope.handled if part[1])
        else:
            await await_deliveries(scope.handled)


@contextlib.asynccontextmanager
async def event_scope(event: EventT[bytes]) -> AsyncIterator[None]:
    """Process one event as one unit: a batch of one part."""
    async with batch_scope() as scope:
        with scope.part(event):
            yield


@contextlib.contextmanager
def part_scope(event: EventT[bytes], pending: list[FutureMessage]) -> Iterator[None]:
    """One event, or one partition's part of a batch (``event`` is its last): the unit of table writes and sends.

    Faust's current event is ``event`` (tables read and write its partition, sends join its partition's
    transaction); table writes are written once per key at the end; changelog writes and sends are added
    to ``pending``, which :func:`batch_scope` awaits (:func:`await_deliveries`) before it leaves the commit
    gate. When the body raises, its pending table writes are dropped: the event was not handled, and its
    redelivery starts from the state before it.
    """
    sends_token = _scope_sends.set(pending)
    writes_token = _scope_writes.set({})
    event_token = _current_event.set(weakref.ref(event))
    try:
        yield
        _write_out_tables()
    finally:
        _current_event.reset(event_token)
        _scope_writes.reset(writes_token)
        _scope_sends.reset(sends_token)


async def await_deliveries(parts: list[tuple[EventT[bytes], list[FutureMessage]]]) -> bool:
    """Wait until every part's changelog writes and sends are delivered; crash the worker when one was not (False)."""
    futures = [future for _, pending in parts for future in pending]
    if not futures:
        return True
    await asyncio.wait(futures, timeout=DELIVERY_TIMEOUT_S)
    for event, pending in parts:
        undelivered = [future for future in pending if not future.done()]
        failed = [future for future in pending if future.done() and future.exception() is not None]
        if undelivered or failed:
            await _undelivered(event, failed[0].exception() if failed else TimeoutError(f"not delivered in {DELIVERY_TIMEOUT_S}s"))
            return False
    return True


async def _undelivered(event: EventT[bytes], problem: BaseException | None) -> None:
    tp = event.message.tp
    app = event.app
    if event.message.generation_id != app.consumer_generation_id or tp not in app.consumer.assignment():
        # A rebalance meanwhile (eager: every partition is revoked, and its producer replaced): the
        # transaction died with its producer, the acks of this generation do not count, and the partition's
        # owner reads it again from the committed offset.
        log.info("writes and sends of %s@%s dropped: a rebalance ended their transaction", tp, event.message.offset)
        return
    message = f"writes or sends of {tp}@{event.message.offset} failed ({problem}): stopping, the transaction must not commit"
    log.error(message)
    await app.crash(RuntimeError(message))


#: Per stream partition: the consumer generation, and the offsets this worker's agents processed in it (not committed yet).
_processed: dict[TP, tuple[int | None, set[int]]] = {}


def first_delivery(event: EventT[Any]) -> bool:
    """Whether this event's offset is new to this worker's agents in the current consumer generation.

    Faust seeks the stream partitions to their committed offsets when recovery ends, after it has let the
    flow resume: an event processed (or buffered for an agent) just before that seek is delivered again
    from the committed offset. Both copies were processed, in the same transaction: an order priced twice
    in the flow crash test. A copy is acked and left out; the first processing is in the open transaction,
    which commits with the first copy's ack. Offsets below the committed one are forgotten: a seek never
    goes below it. A set, not a high-water mark: it makes no assumption on the order in which an agent
    takes a partition's events. Called inside the commit gate.
    """
    message = event.message
    tp, offset = message.tp, message.offset
    seen = _processed.get(tp)
    if seen is None or seen[0] != message.generation_id:
        seen = _processed[tp] = (message.generation_id, set())
    offsets = seen[1]
    if offset in offsets:
        trace("again", tp, offset)
        return False
    offsets.add(offset)
    if len(offsets) > 4096:
        committed = cast(Any, event.app.consumer)._committed_offset.get(tp)
        if committed is not None:
            offsets.difference_update([old for old in offsets if old < committed])
    return True


def to_process(event: EventT[Any]) -> bool:
    """Whether an agent should process this event now; if not, it is acked (an ack that never counts toward a commit).

    Not now: during a rebalance (:meth:`CommitGate.hold`) or of an older consumer generation, the partition's
    owner reads it again from the committed offset; or a copy delivered again by a seek (:func:`first_delivery`).
    Called inside the commit gate.
    """
    if gate.holding or event.message.generation_id != event.app.consumer_generation_id or not first_delivery(event):
        event.ack()
        return False
    return True


def ack_handled(event: EventT[Any]) -> None:
    """Ack an event its agent processed (the only kind of ack a commit counts, see :class:`WeirConsumer`)."""
    consumer = event.app.consumer
    if isinstance(consumer, WeirConsumer):
        consumer.mark_handled(event.message)
    event.ack()


async def until_listed(client: Any, topics: set[str], within_s: float, every_s: float = 0.1) -> list[str]:
    """Wait until the broker's metadata lists every topic of ``topics`` (an aiokafka client's fresh metadata).

    Returns the topics still missing after ``within_s`` (none: all listed). ``WeirConsumerThread.subscribe``
    joins a group only after this.
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


def worker_slot(web_port: int) -> str:
    """The default per-worker transaction id suffix: ``<host name>-<web port>``.

    Unique among live workers: two workers of one host cannot both listen on one port, and a worker's web
    server is up before its consumer joins the group, i.e. before its first transaction (a second worker
    started on a taken port stops before it could fence the first one). Kept across restarts: a worker
    restarted on its host and port (a service manager's restart, a container's) ends the transaction its
    killed predecessor left open when it starts, instead of its partitions waiting for the transaction
    timeout. The port is read when the first transaction starts, after ``faust worker --web-port``.
    """
    return f"{socket.gethostname()}-{web_port}"


def install(worker_transaction: str | None = None, transaction_timeout_ms: int = 10_000, static_member: str | None = None) -> None:
    """Make every Faust app in this process use weir's transaction manager, consumer and producer.

    ``worker_transaction``: run one transaction per worker under that id suffix ("": :func:`worker_slot`;
    KIP-447, :mod:`app.kip447`) instead of one per source partition (None); committed-offset fetches then wait
    for open transactions. ``static_member``: join the consumer groups under that group instance id ("":
    :func:`worker_slot`; None: as a dynamic member).
    """
    global WORKER_TRANSACTION, TRANSACTION_TIMEOUT_MS, STATIC_MEMBER
    WORKER_TRANSACTION = worker_transaction
    STATIC_MEMBER = static_member
    TRANSACTION_TIMEOUT_MS = transaction_timeout_ms
    aiokafka_driver.Transport.TransactionManager = WeirTransactionManager
    aiokafka_driver.Transport.Consumer = WeirConsumer
    aiokafka_driver.Transport.Producer = WeirProducer
    kip447.install(per_worker=worker_transaction is not None)
    _note_skipped_offsets()
    _end_restores_at_markers()


def wipe_local_tables(tabledir: Path) -> None:
    """Drop local RocksDB files so that tables restore from the committed changelog only."""
    if tabledir.exists():
        log.info("exactly_once: local table files at %s are rebuilt from the changelog", tabledir)
        shutil.rmtree(tabledir)
