"""The table write overlay and the sends a scope collects: the Table and Topic classes weir gives Faust.

Inside a scope (:func:`app.engine.scopes.part_scope`) a table reads through and writes to an overlay, written out
once per key when the scope's work is done; every changelog write and topic send is noted, so that the scope
(or the commit) awaits its delivery.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable
from typing import Any

import faust
import orjson
import rocksdict
from faust.stores.rocksdb import Store as RocksDBStore
from faust.types.tuples import FutureMessage, RecordMetadata
from faust.utils.json import on_default

from weir.app.engine.produce import flush, scope_outbox

__all__ = ["WeirTable", "WeirTopic", "send_record", "write_out_tables", "send_changelogs"]

#: What the current scope sent (table changelog writes and topic sends): delivered before it ends.
_scope_sends: contextvars.ContextVar[list[FutureMessage] | None] = contextvars.ContextVar("weir_scope_sends", default=None)
#: The current scope's table writes, per table: written (store and changelog) once per key when it ends.
_scope_writes: contextvars.ContextVar[dict[int, _Writes] | None] = contextvars.ContextVar("weir_scope_writes", default=None)
#: The current scope's changelog records, written out by its tables and not sent yet (:func:`send_changelogs`).
_scope_changelog: contextvars.ContextVar[list[_Record] | None] = contextvars.ContextVar("weir_scope_changelog", default=None)
_DELETED: Any = object()

#: Faust's ``json`` codec is orjson with these options (``faust.utils.json.dumps``) behind its serializer registry.
_FAUST_JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z

#: A changelog record to send: (table, partition, key, value; None: a tombstone), key and value encoded.
_Record = tuple["WeirTable", int, bytes, bytes | None]


class _Writes:
    """One table's reads and writes inside one scope: the last value of each key wins."""

    __slots__ = ("encoded", "reads", "table", "writes")

    def __init__(self, table: WeirTable) -> None:
        self.table = table
        self.reads: dict[Any, Any] = {}
        self.writes: dict[Any, Any] = {}
        #: keys read from the store, as the store's codec encoded them (written out with the same bytes)
        self.encoded: dict[Any, bytes] = {}


class WeirTable(faust.Table[Any, Any]):  # type: ignore[misc]
    """A Faust table that writes once per key per scope, and whose writes the scope waits for.

    Inside :func:`~app.engine.scopes.part_scope` (one event, or one partition's part of a batch) reads and writes go to a
    scope-local overlay: a key read twice is read from RocksDB once, a key written ten times is written
    (store and changelog record) once, when the scope's work is done and before its deliveries are
    awaited. Iterating the table writes the overlay out first. Outside a scope it is Faust's table.
    """

    #: The RocksDB store this table reads and writes directly (not through Faust's mapping), once known; False: none.
    _direct: RocksDBStore | bool | None = None
    #: Whether the direct store's keys and values are Faust's plain ``json`` (no model types): encoded here, same bytes.
    _json: bool = False

    def _direct_store(self) -> RocksDBStore | None:
        """The table's RocksDB store when a key's bytes name one place in it: a partitioned table of keys that do not
        expire (a windowed table keeps Faust's reads and writes, and their expiry bookkeeping); None otherwise."""
        if self._direct is None:
            store = self.data
            direct = not self.use_partitioner and not self.is_global and not self._should_expire_keys()
            self._direct = store if isinstance(store, RocksDBStore) and direct else False
            if isinstance(self._direct, RocksDBStore):
                plain = (store.key_type, store.value_type, store.key_serializer, store.value_serializer)
                self._json = plain == (None, None, "json", "json")
        return self._direct if isinstance(self._direct, RocksDBStore) else None

    # Faust's serializer registry costs 0.6-1.4 us a key or value around orjson's 0.06-0.2 (a lookup, a model check
    # and a str/bytes round trip per call), and a part's aggregator reads and writes about ten per order.
    def _encode_key(self, store: RocksDBStore, key: Any) -> bytes:
        if self._json and isinstance(key, str):
            return orjson.dumps(key, default=on_default, option=_FAUST_JSON_OPTIONS)
        return store._encode_key(key)

    def _encode_value(self, store: RocksDBStore, value: Any) -> bytes | None:
        if self._json and not isinstance(value, bytes):
            return orjson.dumps(value, default=on_default, option=_FAUST_JSON_OPTIONS)
        return store._encode_value(value)

    def _decode_value(self, store: RocksDBStore, raw: bytes) -> Any:
        if self._json:
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return store._decode_value(raw)  # Faust's error
            if not (isinstance(value, dict) and "__faust" in value):  # a blessed model: Faust's to rebuild
                return value
        return store._decode_value(raw)

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
        value = self._read(overlay, key)
        return self.__missing__(key) if value is _DELETED else value

    def get(self, key: Any, default: Any = None) -> Any:
        """``Mapping.get`` without a ``KeyError`` raised and caught for a key not there (a new group's reads miss)."""
        overlay = self._writes()
        if overlay is None or self.default is not None:
            return super().get(key, default)
        value = self._read(overlay, key)
        return default if value is _DELETED else value

    def _read(self, overlay: _Writes, key: Any) -> Any:
        """The key's value in the scope: its write, its earlier read, or the store's (read once); _DELETED: none."""
        for layer in (overlay.writes, overlay.reads):
            if key in layer:
                return layer[key]
        store = self._direct_store()
        if store is None:
            try:
                value = super().__getitem__(key)
            except KeyError:
                value = _DELETED
            overlay.reads[key] = value
            return value
        # Faust's read encodes the key twice and reads RocksDB twice (``key in data``, then ``data[key]``): once here.
        key_bytes = overlay.encoded[key] = self._encode_key(store, key)
        self.on_key_get(key)
        event = faust.current_event()
        # Faust's ``_get`` without its key index (see :meth:`_write_out_direct`)
        found = store._get(key_bytes) if event is None else store._db_for_partition(event.message.partition).get(key_bytes)
        value = overlay.reads[key] = _DELETED if found is None else self._decode_value(store, found)
        return value

    def written_in_scope(self, key: Any) -> Any:
        """What the current scope wrote to ``key`` and has not written out yet (None: nothing, or a delete); the
        value itself, which the scope may still change in place before it writes it again (see
        :meth:`app.deadlines.DeadlineIndex._merged`)."""
        scopes = _scope_writes.get()
        overlay = None if scopes is None else scopes.get(id(self))
        value = None if overlay is None else overlay.writes.get(key)
        return None if value is _DELETED else value

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
        records = _scope_changelog.get()
        store = self._direct_store()
        event = faust.current_event()
        if store is not None and self.app.in_transaction and records is not None and event is not None and scope_outbox.get() is not None:
            self._write_out_direct(overlay, store, event, records)
            return
        for key, value in overlay.writes.items():
            if value is not _DELETED:
                faust.Table.__setitem__(self, key, value)
            elif faust.Table.__contains__(self, key):
                faust.Table.__delitem__(self, key)

    def _write_out_direct(self, overlay: _Writes, store: RocksDBStore, event: Any, records: list[_Record]) -> None:
        """Faust's table write (store, then changelog record), with the record encoded once and sent by the scope.

        The same bytes in the same places as ``faust.Table.__setitem__`` / ``__delitem__``: the key and value
        encoded by the store's codecs (a changelog record is restored into the store as it is), the store of
        the current event's partition, the changelog partition of that number. What it leaves out is Faust's
        way to the producer for every write: ``send_soon`` (a future message, the producer's buffer, its task,
        a publish and callbacks per record); the scope sends the records at its end (:func:`send_changelogs`).
        A part that fails with records not sent stops the worker (``app.engine.scopes``): the store is then ahead
        of its changelog. Windowed tables (keys that expire) keep Faust's write, and its expiry bookkeeping.
        """
        self._verify_source_topic_partitions(event.message.topic)  # once per part (Faust's write checked every key)
        partition = event.message.partition
        encoded = overlay.encoded
        # The part's writes go to the partition's database in one write (a RocksDB write batch: one write to its log
        # and memtable, not one per key, which was 5% of a three-stage worker's samples), as Faust's ``_set`` and
        # ``_del`` would apply them one by one. Faust's key index (an LRU cache behind a lock, for reads outside an
        # event) is not kept: a read outside an event looks in every database without it, and a read in one, as
        # here, looks only in the event's partition's, where a delete is then done too (Faust's ``_del`` deleted in
        # every database when the index did not know the key).
        db = store._db_for_partition(partition)
        batch = rocksdict.WriteBatch(raw_mode=True) if getattr(store, "use_rocksdict", False) else None
        for key, value in overlay.writes.items():
            key_bytes = encoded.get(key) or self._encode_key(store, key)
            if value is not _DELETED:
                value_bytes = self._encode_value(store, value)
                if batch is None:
                    store._set(key_bytes, value_bytes)
                else:
                    batch.put(key_bytes, value_bytes)
                records.append((self, partition, key_bytes, value_bytes))
            elif db.get(key_bytes) is not None:
                if batch is None:
                    store._del(key_bytes)
                else:
                    batch.delete(key_bytes)
                records.append((self, partition, key_bytes, None))
        if batch is not None and len(batch):
            db.write(batch)

    def _on_records_sent(self, delivered: asyncio.Future[RecordMetadata], after_first: int) -> None:
        """Faust's ``_on_changelog_sent`` for a record batch of this table's changelog (:mod:`app.engine.produce`) whose
        last record is ``after_first`` records after its first, whose offset the delivery's metadata holds: under
        exactly_once, the offset the store holds once the transaction commits (recorded then,
        :func:`app.engine.commit.persist_changelog_positions`); under at_least_once, the offset the store holds now."""
        if delivered.cancelled() or delivered.exception() is not None:
            return  # the scope's delivery check fails the batch
        metadata = delivered.result()
        offset = metadata.offset + after_first
        if self.app.in_transaction:
            self.app.tables.persist_offset_on_commit(self.data, metadata.topic_partition, offset)
        else:
            self.data.set_persisted_offset(metadata.topic_partition, offset)

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
    """A Faust topic whose sends inside :func:`~app.engine.scopes.part_scope` are delivered before a commit covers them.

    An agent can send without awaiting each delivery: the scope collects them, and they are awaited once,
    at the end of the batch (at_least_once) or by the next commit (exactly_once, :func:`~app.engine.scopes.batch_scope`).
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
        box = scope_outbox.get()
        if box is not None and box.records:
            await flush([box])  # the part's records noted before this one go first
        result = await super().publish_message(fut, wait=wait)
        pending = _scope_sends.get()
        if pending is not None and not wait:
            pending.append(fut)
        return result


async def send_record(
    topic: faust.TopicT, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None = None, partition: int | None = None
) -> None:
    """Send one encoded record to ``topic`` (to ``partition``, else by its key) in the current scope: noted in the
    part's outbox, and queued with the batch's other records in the producer (and the transaction) of the scope's
    source partition (:mod:`app.engine.produce`), its delivery awaited with the scope's other sends.

    The same record, producer and transaction as ``topic.send(key=..., value=...)``, without Faust's way there:
    a pending message and a future message per send, key and value preparation (weir sends bytes), the send
    sensors and a delivery callback, and a ``send()`` into aiokafka per record. Outside a part (nothing collects
    the send), or with Faust's producer not started yet (the part has no outbox), Faust's way.
    """
    box = scope_outbox.get()
    if box is not None:
        box.records.append((topic, partition, key, value, headers, None))
        return
    extra: dict[str, Any] = {}  # only what was given: Faust's send, or a stand-in for a topic in a unit test
    if partition is not None:
        extra["partition"] = partition
    if headers:
        extra["headers"] = headers
    await topic.send(key=key, value=value, **extra)


def send_changelogs(records: list[_Record]) -> None:
    """Queue the changelog records a scope's tables wrote out (``WeirTable._write_out_direct``), in order, with the
    part's sends (:mod:`app.engine.produce`): in the transaction of the scope's source partition, delivered with the
    batch's other sends. Only a part with an outbox writes out this way (:meth:`WeirTable.write_out`)."""
    if not records:
        return
    box = scope_outbox.get()
    assert box is not None, "direct table writes only inside a part with an outbox"
    box.records.extend((table.changelog_topic, partition, key, value, None, table) for table, partition, key, value in records)
    records.clear()


def write_out_tables() -> None:
    """Write the current scope's pending writes of every table now (store and changelog), before its event ends."""
    scopes = _scope_writes.get()
    while scopes:
        next(iter(scopes.values())).table.write_out()
