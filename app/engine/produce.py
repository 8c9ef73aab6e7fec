"""A batch's sends as record batches: one aiokafka ``BatchBuilder`` per output partition, not a send per record.

``send_record`` inside a part (:meth:`app.engine.scopes.BatchScope.part`) notes the record in the part's
:class:`Outbox`, and so does the part's end for its tables' changelog records (``send_changelogs``). When the
batch's parts are handled, :func:`flush` groups what they noted by producer and output partition, in the order
they were noted, and appends each group to record batches (aiokafka's compiled record-batch builder): first to
the partition's batch still waiting in the producer's queue, if any, as a ``send()`` would; then to new batches
of up to ``EngineConfig.record_batch_bytes``, each queued with ``AIOKafkaProducer.send_batch``. One future per
batch, not a ``send()`` coroutine, Faust's producer layers, a lock and a future per record. The futures join the
parts' pending deliveries, awaited by the next commit (exactly_once) or by the batch (at_least_once), as the
futures of single sends were; a changelog batch records its table's position from its last record's offset.

What stays as it was: the same producer and transaction per source partition
(``WeirTransactionManager.transactional_id_for``), the same partition per key (the producer's own partitioner,
or, when that is aiokafka's default, Kafka's murmur2 computed the same way), the same order per output partition
(records are appended to the partition's last queued batch, or to a batch queued after it). What changes: a part
that raises sends nothing (its records were only noted), where single sends had put its first records in the
transaction already; and a Faust send (``WeirTopic``) inside a part first flushes what the part noted, so that
one partition's records keep the order they were sent in.

Private names relied on: aiokafka's ``AIOKafkaProducer._message_accumulator`` (its ``_batches`` and
``_compression_type``), ``_partition``, ``_partitioner``, ``_metadata``, ``_txn_manager``,
``client._wait_on_metadata``, ``MessageBatch._builder`` and ``future``, ``BatchBuilder._relative_offset``;
Faust's ``Producer._transaction_producers`` and ``_trn_locks``.
"""

from __future__ import annotations

import asyncio
import contextvars
import struct
from typing import Any, cast

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.structs import TopicPartition
from faust.types.tuples import FutureMessage

from weir.app.engine.config import installed

__all__ = ["Outbox", "scope_outbox", "flush", "murmur2"]

#: A noted record: (topic, partition or None: by its key, key, value, headers or None, the table whose changelog
#: record it is or None).
_Noted = tuple[Any, "int | None", "bytes | None", "bytes | None", "list[tuple[str, bytes]] | None", Any]


class Outbox:
    """What one part sent: noted in order, queued by :func:`flush`; its batches' futures go to ``pending``."""

    __slots__ = ("event", "pending", "records")

    def __init__(self, event: Any, pending: list[FutureMessage]) -> None:
        self.event = event
        self.pending = pending
        self.records: list[_Noted] = []


#: The current part's outbox (None: outside a part, or its producer is not started: Faust's way).
scope_outbox: contextvars.ContextVar[Outbox | None] = contextvars.ContextVar("weir_scope_outbox", default=None)


def _producer_of(event: Any) -> tuple[Any, Any]:
    """The aiokafka producer a send made for ``event`` goes through, and the lock Faust takes around its sends (None)."""
    app = event.app
    if app.in_transaction:
        manager = app.consumer.transactions
        source = event.message.tp
        transactional_id = manager.transactional_id_for(source.topic, source.partition)
        faust_producer = manager.producer
        producer = faust_producer._transaction_producers.get(transactional_id)
        if producer is None:
            raise RuntimeError(f"no transaction producer for {transactional_id}")
        return producer, faust_producer._trn_locks[transactional_id]
    return app.producer._ensure_producer(), None


async def flush(outboxes: list[Outbox]) -> None:
    """Queue the records of ``outboxes`` (in the order their parts ran) as record batches; each outbox is emptied.

    A group's batch futures join the pending deliveries of the last outbox that added to the group.
    """
    #: per (producer, topic, partition): [producer, lock, records, pending]
    groups: dict[tuple[int, str, int], list[Any]] = {}
    names: dict[int, str] = {}  # per topic object
    partitions: dict[tuple[int, str], list[int]] = {}  # per producer and topic: its partitions, its metadata awaited
    for box in outboxes:
        if not box.records:
            continue
        producer, lock = _producer_of(box.event)
        producer_id = id(producer)
        for noted in box.records:
            topic, partition, key, value, _, _ = noted
            name = names.get(id(topic))
            if name is None:
                name = names[id(topic)] = topic.get_topic_name()
            every = partitions.get((producer_id, name))
            if every is None:
                await producer.client._wait_on_metadata(name)
                every = partitions[(producer_id, name)] = list(producer._metadata.partitions_for_topic(name))
            if partition is None:
                partition = _key_partition(producer, name, key, value, every)
            group = groups.get((producer_id, name, partition))
            if group is None:
                group = groups[(producer_id, name, partition)] = [producer, lock, [], box.pending]
            group[2].append(noted)
            group[3] = box.pending
        box.records = []
    for (_, name, partition), (producer, lock, records, pending) in groups.items():
        if lock is None:
            await _queue(producer, name, partition, records, pending)
        else:
            async with lock:
                await _queue(producer, name, partition, records, pending)


def _key_partition(producer: Any, topic: str, key: bytes | None, value: bytes | None, every: list[int]) -> int:
    """The partition ``producer`` would send ``key`` to: its own partitioner's choice, or, when that is aiokafka's
    default (Kafka's: murmur2 of the key), the same choice by :func:`murmur2` (``every``: the topic's partitions as
    aiokafka lists them)."""
    if key is None or not isinstance(producer._partitioner, DefaultPartitioner):
        return int(producer._partition(topic, None, key, value, key, value))
    return every[(murmur2(key) & 0x7FFFFFFF) % len(every)]


_M = 0x5BD1E995
_WORDS: dict[int, struct.Struct] = {}


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``, as an unsigned 32-bit int): the
    same value as aiokafka's ``murmur2`` (a property test), in about half its time (its words read at once)."""
    length = len(data)
    h = 0x9747B28C ^ length
    words = length >> 2
    if words:
        unpack = _WORDS.get(words)
        if unpack is None:
            unpack = _WORDS[words] = struct.Struct(f"<{words}I")
        for k in unpack.unpack_from(data):
            k = (k * _M) & 0xFFFFFFFF
            k ^= k >> 24
            h = ((h * _M) & 0xFFFFFFFF) ^ ((k * _M) & 0xFFFFFFFF)
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M) & 0xFFFFFFFF
    return h ^ (h >> 15)


async def _queue(producer: Any, topic: str, partition: int, records: list[_Noted], pending: list[FutureMessage]) -> None:
    """Append ``records`` to record batches of ``topic``'s ``partition`` and queue each in ``producer``.

    A batch of the partition still waiting in the producer's queue (not drained into a request yet) takes
    records first, as a single ``send()`` would have put them there: a new batch of a partition is queued only
    once the one before it is drained, and with a request to the broker in flight that waits for its answer.
    The flows agent ends a batch after every event, so each of its events would have waited for a round trip.
    """
    table = records[0][5]  # a changelog partition is one table's
    taken = 0
    queued = producer._message_accumulator._batches.get(TopicPartition(topic, partition))
    if queued:
        waiting = queued[-1]  # closed (None) once drained, or when a commit flushes the transaction
        for _, _, key, value, headers, _ in records:
            if waiting._builder.append(timestamp=None, key=key, value=value, headers=headers or []) is None:
                break
            taken += 1
        if taken:
            delivered = cast(FutureMessage, asyncio.shield(waiting.future))  # awaited, done, exception: alike
            if table is not None:
                # the position is known once the batch is: the records before ours are counted from the builder
                first = waiting._builder._relative_offset - taken
                delivered.add_done_callback(lambda done: table._on_records_sent(done, first + taken - 1))
            pending.append(delivered)
            if taken == len(records):
                return
    # A limit above a producer's own batches (max_batch_size, 16 KiB by default): a batch's records to one partition
    # go in one record batch, as a second one waits until the first is drained (EngineConfig.record_batch_bytes).
    size = installed().record_batch_bytes
    compression = producer._message_accumulator._compression_type
    transactional = producer._txn_manager is not None and producer._txn_manager.transactional_id is not None
    batch = BatchBuilder(size, compression, is_transactional=transactional)
    count = 0
    for _, _, key, value, headers, _ in records[taken:]:
        if batch.append(timestamp=None, key=key, value=value, headers=headers or []) is None:  # full
            await _send(producer, batch, topic, partition, count, table, pending)
            batch = BatchBuilder(size, compression, is_transactional=transactional)
            batch.append(timestamp=None, key=key, value=value, headers=headers or [])
            count = 0
        count += 1
    await _send(producer, batch, topic, partition, count, table, pending)


async def _send(
    producer: Any, batch: BatchBuilder, topic: str, partition: int, count: int, table: Any, pending: list[FutureMessage]
) -> None:
    """Queue ``batch`` (``count`` records); a changelog batch records its table's position once delivered."""
    delivered = await producer.send_batch(batch, topic, partition=partition)
    if table is not None:
        # the batch's metadata holds its first record's offset; the table's position is its last record's
        delivered.add_done_callback(lambda done: table._on_records_sent(done, count - 1))
    pending.append(delivered)
