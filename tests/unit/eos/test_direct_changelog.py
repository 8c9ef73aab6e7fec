"""A RocksDB table's writes in a scope go to the store and the changelog as Faust's own write would put them.

``WeirTable._write_out_direct`` encodes each key and value once with the store's codecs, writes the store of
the event's partition, and leaves the changelog record for the batch to send in its transaction, in record
batches (``BatchScope.part``, ``app.engine.produce``; read back here from the batches' bytes). The same
operations run here through Faust's own ``Table.__setitem__`` / ``__delitem__`` (whose ``send_changelog`` is
caught) on a second RocksDB store: both stores must hold the same bytes, and both changelogs the same records,
partition, key and value bytes, tombstones included.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import faust
from aiokafka.record.default_records import DefaultRecordBatch
from faust.tables.base import Collection
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app import engine
from weir.app.deadlines import DeadlineIndex
from weir.app.engine.scopes import BatchScope, batch_scope, gate

KEYS = st.sampled_from(["a", "b", "ключ", "order-7"])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5)
)
#: JSON values as the tables hold them (the scope encodes them itself, as Faust's json codec would). Not None itself:
#: Faust writes ``null`` to the store and a tombstone to the changelog for it, the scope ``null`` to both.
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8
).filter(lambda value: value is not None)
OPS = st.lists(st.one_of(st.tuples(st.just("set"), KEYS, VALUES), st.tuples(st.just("del"), KEYS)), max_size=12)
PARTITION = 3


class Event:
    """The part of a Faust event a scope and a store use (weak-referenceable, like Faust's)."""

    message = SimpleNamespace(
        partition=PARTITION, topic="weir.source", offset=0, generation_id=0, tp=faust.types.TP("weir.source", PARTITION)
    )

    def __init__(self, app: Any = None) -> None:
        if app is not None:
            self.app = app


class Transactions:
    """The consumer's transaction manager with one transactional aiokafka producer, whose record batches it reads back:
    records what was sent, and answers each batch with a delivered future."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int | None, bytes | None, bytes | None]] = []
        producer = SimpleNamespace(
            _message_accumulator=SimpleNamespace(_batches={}, _compression_type=0),
            _txn_manager=SimpleNamespace(transactional_id="t"),
            client=SimpleNamespace(_wait_on_metadata=self._metadata),
            _metadata=SimpleNamespace(partitions_for_topic=lambda topic: {PARTITION}),
            send_batch=self.send_batch,
        )
        self.producer = SimpleNamespace(_transaction_producers={"t": producer}, _trn_locks={"t": asyncio.Lock()})

    def transactional_id_for(self, topic: str, partition: int) -> str:
        return "t"

    async def _metadata(self, topic: str) -> set[int]:
        return {PARTITION}

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        first = len(self.sent)
        for record in DefaultRecordBatch(bytes(batch._build())):
            self.sent.append((topic, partition, record.key, record.value))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.set_result(SimpleNamespace(topic_partition=faust.types.TP(topic, partition), offset=first))
        return future


def make_table(directory: Path, name: str) -> Any:
    app = faust.App(
        f"direct-{name}",
        store="rocksdb://",
        datadir=str(directory / name),
        processing_guarantee="exactly_once",
        autodiscover=False,
        Table="weir.app.engine:WeirTable",
    )
    app.__dict__["in_transaction"] = True  # a worker's app under exactly_once
    app.tables.persist_offset_on_commit = lambda store, tp, offset: None
    table = app.Table("t", default=None, partitions=4, schema=faust.Schema(key_serializer="json", value_serializer="json"))
    table._verify_source_topic_partitions = lambda topic: None
    return table


def stored(table: Any) -> dict[bytes, bytes]:
    db = table.data._db_for_partition(PARTITION)
    return {bytes(key): bytes(value) for key, value in db.items()}


def run_ops(table: Any, ops: list[tuple[Any, ...]]) -> None:
    for op in ops:
        if op[0] == "set":
            table[op[1]] = op[2]
        elif op[1] in table:
            del table[op[1]]


@settings(max_examples=40, deadline=None)
@given(initial=st.lists(st.tuples(KEYS, VALUES), max_size=4), ops=OPS)
def test_direct_writes_leave_the_store_and_the_changelog_as_faust_s_own(tmp_path_factory: Any, initial: list[Any], ops: list[Any]) -> None:
    directory = tmp_path_factory.mktemp("stores")
    direct, faust_way = make_table(directory, "direct"), make_table(directory, "faust")
    transactions = Transactions()
    direct.app.consumer = SimpleNamespace(transactions=transactions)
    caught: list[tuple[str, int | None, bytes | None, bytes | None]] = []

    def send_changelog(self: Any, partition: int, key: Any, value: Any, key_serializer: Any = None, value_serializer: Any = None) -> Any:
        topic = self.changelog_topic
        key_bytes = topic.prepare_key(key, key_serializer or self.key_serializer)[0]
        value_bytes = topic.prepare_value(value, value_serializer or self.value_serializer)[0] if value is not None else None
        caught.append((topic.get_topic_name().replace("faust", "direct"), partition, key_bytes, value_bytes))
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    async def run() -> None:
        with mock.patch.object(Collection, "send_changelog", send_changelog):
            with engine.part_scope(Event(), []):  # the initial state, Faust's way on both
                for key, value in initial:
                    direct[key] = value
                    faust_way[key] = value
            caught.clear()
            scope = BatchScope()
            async with scope.part(Event(direct.app)):
                run_ops(direct, ops)
            await scope.flush()
            event = Event()
            with engine.part_scope(event, []):  # no records list: Faust's own writes, one per operation
                run_ops(faust_way, ops)

    asyncio.run(run())
    assert direct._direct_store() is not None
    assert direct._json, "the scope encodes the keys and values itself, not through Faust's registry"
    assert stored(direct) == stored(faust_way)
    # Faust's way writes every operation; the scope writes each key once, its last value: compare the last per key
    last_faust = {key: (topic, partition, value) for topic, partition, key, value in caught}
    last_direct = {key: (topic, partition, value) for topic, partition, key, value in transactions.sent}
    assert len(last_direct) == len(transactions.sent), "each key written once per scope"
    assert last_direct == {key: record for key, record in last_faust.items() if key in last_direct}
    assert set(last_faust) - set(last_direct) <= {key for key, (_, _, value) in last_faust.items() if value is None}, (
        "a key Faust wrote and the scope did not is one created and deleted in the scope"
    )
    assert all(partition == PARTITION for _, partition, _, _ in transactions.sent)


READS = st.lists(
    st.one_of(st.tuples(st.just("set"), KEYS, VALUES), st.tuples(st.just("del"), KEYS), st.tuples(st.just("get"), KEYS)), max_size=16
)


@settings(max_examples=40, deadline=None)
@given(initial=st.lists(st.tuples(KEYS, VALUES), max_size=4), ops=READS)
def test_reads_in_a_scope_see_the_store_and_the_scope_s_own_writes(tmp_path_factory: Any, initial: list[Any], ops: list[Any]) -> None:
    """A scope reads a key from the store of its event's partition once (the store's codecs, one RocksDB read), then
    from its overlay; what it reads is what a dict given the same writes holds, and once the scope is written out,
    Faust's own read (outside any scope) sees the same."""
    table = make_table(tmp_path_factory.mktemp("stores"), "reads")
    table.app.consumer = SimpleNamespace(transactions=Transactions())
    model: dict[Any, Any] = {}
    read: list[Any] = []
    expected: list[Any] = []

    def send_changelog(self: Any, partition: int, *args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    async def run() -> None:
        with mock.patch.object(Collection, "send_changelog", send_changelog), engine.part_scope(Event(), []):
            for key, value in initial:  # the initial state, Faust's way
                table[key] = value
                model[key] = value
        scope = BatchScope()
        async with scope.part(Event(table.app)):
            for op in ops:
                if op[0] == "set":
                    table[op[1]] = model[op[1]] = op[2]
                elif op[0] == "del":
                    if op[1] in table:
                        del table[op[1]]
                    model.pop(op[1], None)
                else:
                    read.append((table.get(op[1], "absent"), op[1] in table))
                    expected.append((model.get(op[1], "absent"), op[1] in model))
        await scope.flush()

    asyncio.run(run())
    assert read == expected
    outside = {key: faust.Table.get(table, key, "absent") for key in ("a", "b", "ключ", "order-7")}
    assert outside == {key: model.get(key, "absent") for key in outside}


def test_a_read_in_a_scope_encodes_its_key_once_for_the_read_and_the_write(tmp_path: Path) -> None:
    """Faust's own read encodes the key and reads RocksDB twice (``key in data``, then ``data[key]``); a scope's read of
    a key it then writes encodes the key once, for both."""
    table = make_table(tmp_path, "once")
    table.app.consumer = SimpleNamespace(transactions=Transactions())
    encoded: list[Any] = []
    encode = table._encode_key

    def counting(store: Any, key: Any) -> bytes:
        encoded.append(key)
        return encode(store, key)

    async def run() -> None:
        scope = BatchScope()
        async with scope.part(Event(table.app)):
            table["k"] = 1
        await scope.flush()
        table._encode_key = counting
        async with scope.part(Event(table.app)):
            table["k"] = table.get("k", 0) + 1
        await scope.flush()

    asyncio.run(run())
    assert encoded == ["k"]
    assert faust.Table.get(table, "k") == 2


class Refusing(Transactions):
    """A transaction manager whose producer refuses a batch (a closed or fenced producer, a transaction ended)."""

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
        raise RuntimeError("refused")


def _crashes(tmp_path: Path, body: Any, transactions: Transactions) -> tuple[list[BaseException], BaseException | None]:
    table = make_table(tmp_path, "crash")
    table.app.consumer = SimpleNamespace(transactions=transactions)
    crashes: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashes.append(reason)

    table.app.crash = crash
    raised: BaseException | None = None

    async def run() -> None:
        nonlocal raised
        scope = BatchScope()
        try:
            async with batch_scope() as scope, scope.part(Event(table.app)):
                body(table)
        except BaseException as error:
            raised = error

    asyncio.run(run())
    return crashes, raised


def test_a_part_whose_changelog_records_are_not_all_sent_stops_the_worker(tmp_path: Path) -> None:
    def two_keys(table: Any) -> None:
        table["a"] = 1
        table["b"] = 2

    crashes, raised = _crashes(tmp_path, two_keys, Refusing())
    assert raised is None, "the part was handled: its records are queued when the batch ends, and refused then"
    assert len(crashes) == 1, "the store is ahead of its changelog: the worker stops"
    assert "not in the changelog" in str(crashes[0])
    assert gate.refused is not None, "and commits nothing more on its way out"


def test_a_part_that_raises_after_an_early_write_out_stops_the_worker(tmp_path: Path) -> None:
    def iterate_then_fail(table: Any) -> None:
        table["a"] = 1
        list(table.items())  # writes the overlay out now: "a" is in the store, its record not sent yet
        raise ValueError("a bug after the iteration")

    crashes, raised = _crashes(tmp_path, iterate_then_fail, Transactions())
    assert isinstance(raised, ValueError)
    assert len(crashes) == 1


def test_a_part_that_raises_before_any_write_out_does_not_stop_the_worker(tmp_path: Path) -> None:
    def fail(table: Any) -> None:
        table["a"] = 1
        raise ValueError("bad input")

    crashes, raised = _crashes(tmp_path, fail, Transactions())
    assert isinstance(raised, ValueError)
    assert crashes == [], "nothing reached the store: the part's writes are dropped, as before"
    assert gate.refused is None


def test_a_deadline_index_merges_the_entries_one_part_files_and_no_others(tmp_path: Path) -> None:
    """On a WeirTable the keys a part files in one second share an entry (``written_in_scope``); the next part's keys
    start a new one, and the entries written out are what the store then holds."""
    table = make_table(tmp_path, "deadlines")
    table.app.consumer = SimpleNamespace(transactions=Transactions())
    index = DeadlineIndex(table)

    async def run() -> None:
        scope = BatchScope()
        async with scope.part(Event(table.app)):
            for key in ("a", "b", "c"):
                index.add(PARTITION, "done", key, 5_000)
        async with scope.part(Event(table.app)):
            index.add(PARTITION, "done", "d", 5_500)
        await scope.flush()

    asyncio.run(run())
    entries = {key: faust.Table.get(table, key) for key in (f"{PARTITION}:5", f"{PARTITION}:5:0", f"{PARTITION}:5:1")}
    assert entries == {f"{PARTITION}:5": 2, f"{PARTITION}:5:0": ["done", ["a", "b", "c"]], f"{PARTITION}:5:1": ["done", "d"]}
