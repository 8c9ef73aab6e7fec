"""The outbox without Kafka: the stream trigger's protocol under any interleaving, the SQLite and PostgreSQL stores
(one contract; PostgreSQL on the session's real server), the dedup helper."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from weir.app.outbox import (
    OUTBOX_ID_FIELD,
    OUTBOX_ID_HEADER,
    OUTBOX_SOURCE_HEADER,
    Decision,
    Doorbell,
    Outbox,
    OutboxDedup,
    PostgresOutbox,
    RelayRound,
    SQLiteOutbox,
    StreamTrigger,
    open_outbox,
    outbox_id_of,
    write,
)

# --------------------------------------------------------------------------------------------------
# The stream trigger, in a simulated world of writers, signals in flight and one relay
# --------------------------------------------------------------------------------------------------

DOORBELL = -1  # a signal that, like the relay's doorbell answer, reads the newest committed id when delivered

#: (kind, argument): "commit" n rows and signal their offset; "ring" n rows through the doorbell; "ring_lost"
#: n rows whose ring found the queue full (only while another ring is queued); "stale" re-send an old offset;
#: "deliver" the i-th signal in flight (any order); "relay" one step of the relay; "timer" the safety timer.
Action = tuple[str, int]

actions = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["commit", "ring", "ring_lost"]), st.integers(1, 3)),
        st.tuples(st.sampled_from(["stale", "deliver", "relay"]), st.integers(0, 50)),
        st.tuples(st.just("timer"), st.just(0)),
    ),
    max_size=80,
)


@dataclass
class World:
    """Writers commit rows 1..committed; the relay has published rows 1..published."""

    trigger: StreamTrigger
    batch_size: int
    committed: int = 0
    published: int = 0
    in_flight: list[int] = field(default_factory=list)
    relay_sleeping: bool = False
    report_due: int | None = None  # drained_through of a drained read, not yet reported
    use_safety_timer: bool = True
    violations: list[str] = field(default_factory=list)

    def apply(self, kind: str, argument: int) -> None:
        if kind == "commit":
            self.committed += argument
            self.in_flight.append(self.committed)  # writers signal after COMMIT
        elif kind == "ring":
            self.committed += argument
            self.in_flight.append(DOORBELL)
        elif kind == "ring_lost" and DOORBELL in self.in_flight:
            self.committed += argument
        elif kind == "stale":
            self.in_flight.append(argument % (self.committed + 1))
        elif kind == "deliver" and self.in_flight:
            self.deliver(self.in_flight.pop(argument % len(self.in_flight)))
        elif kind == "relay":
            self.relay_step()
        elif kind == "timer" and self.use_safety_timer:
            self.trigger, decision = self.trigger.on_safety_timer()
            if decision is Decision.WAKE:
                self.relay_sleeping = False
        if self.trigger.sleeping != self.relay_sleeping:
            self.violations.append(f"after {kind}: the trigger thinks sleeping={self.trigger.sleeping}, the relay is {self.relay_sleeping}")

    def deliver(self, offset: int) -> None:
        if offset == DOORBELL:
            offset = self.committed
        self.trigger, decision = self.trigger.on_signal(offset)
        if decision is Decision.WAKE:
            if not self.relay_sleeping:
                self.violations.append(f"signal {offset} woke the relay while it runs")
            if self.committed <= self.published:
                self.violations.append(f"signal {offset} woke the relay with nothing to publish")
            self.relay_sleeping = False

    def relay_step(self) -> None:
        if self.relay_sleeping:
            return
        if self.report_due is None:  # read one batch, publish it, mark it sent
            read = min(self.batch_size, self.committed - self.published)
            self.published += read
            if read < self.batch_size:
                self.report_due = self.committed
            return
        self.trigger, decision = self.trigger.on_going_to_sleep(self.report_due)
        self.report_due = None
        if decision is Decision.SLEEP:
            self.relay_sleeping = True

    def quiesce(self) -> None:
        """Deliver every signal in flight, then let the relay run until it sleeps; nothing may be left."""
        while self.in_flight:
            self.deliver(self.in_flight.pop(0))
        steps_allowed = 2 * (self.committed // self.batch_size) + 4
        for _ in range(steps_allowed):
            if self.relay_sleeping:
                break
            self.relay_step()
        if not self.relay_sleeping:
            self.violations.append(f"the relay still runs after {steps_allowed} steps with everything delivered (it spins)")
        if self.published < self.committed:
            self.violations.append(f"lost wake-up: rows {self.published + 1}..{self.committed} unpublished while the relay sleeps")


def simulate(trigger: StreamTrigger, steps: list[Action], batch_size: int, *, use_safety_timer: bool = True) -> World:
    world = World(trigger=trigger, batch_size=batch_size, use_safety_timer=use_safety_timer)
    for kind, argument in steps:
        world.apply(kind, argument)
    world.quiesce()
    return world


@settings(max_examples=600)
@given(steps=actions, batch_size=st.integers(1, 4), use_safety_timer=st.booleans())
def test_no_lost_wake_up_and_never_woken_while_running(steps: list[Action], batch_size: int, use_safety_timer: bool) -> None:
    world = simulate(StreamTrigger(), steps, batch_size, use_safety_timer=use_safety_timer)
    assert world.violations == []
    assert world.relay_sleeping
    assert world.published == world.committed


class SleepsRegardless(StreamTrigger):
    """A broken trigger: ignores signals that came while the relay ran (the classic lost wake-up)."""

    def on_going_to_sleep(self, processed_offset: int) -> tuple[StreamTrigger, Decision]:
        return replace(self, processed_offset=max(self.processed_offset, processed_offset), sleeping=True), Decision.SLEEP


class WakesOnEverySignal(StreamTrigger):
    """A broken trigger: wakes on any signal, running or not."""

    def on_signal(self, offset: int) -> tuple[StreamTrigger, Decision]:
        return replace(self, newest_offset=max(self.newest_offset, offset), sleeping=False), Decision.WAKE


@pytest.mark.parametrize("broken", [SleepsRegardless(), WakesOnEverySignal()], ids=type)
def test_the_simulation_catches_broken_triggers(broken: StreamTrigger) -> None:
    # The property above is only worth something if it fails for a trigger that gets the protocol wrong.
    failing = find(actions, lambda steps: bool(simulate(broken, steps, 1, use_safety_timer=False).violations))
    assert simulate(broken, failing, 1, use_safety_timer=False).violations


def test_trigger_events_by_hand() -> None:
    running = StreamTrigger()
    running, decision = running.on_signal(5)
    assert decision is Decision.NOTHING  # running: remembered, no wake
    running, decision = running.on_going_to_sleep(3)
    assert decision is Decision.WAKE  # 4 and 5 are newer than what it processed
    asleep, decision = running.on_going_to_sleep(5)
    assert (decision, asleep.sleeping) == (Decision.SLEEP, True)
    assert asleep.on_signal(4)[1] is Decision.NOTHING  # stale: already processed
    woken, decision = asleep.on_signal(6)
    assert (decision, woken.sleeping) == (Decision.WAKE, False)
    assert woken.on_signal(7)[1] is Decision.NOTHING
    with pytest.raises(ValueError, match="already sleeps"):
        asleep.on_going_to_sleep(5)


# --------------------------------------------------------------------------------------------------
# The stores: one contract, SQLite and PostgreSQL
# --------------------------------------------------------------------------------------------------

OutboxFactory = Callable[..., Outbox]


@pytest.fixture(params=["sqlite", "postgresql"])
def new_outbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OutboxFactory]:
    """Makes empty outboxes of one kind: a SQLite file, or a fresh schema on the session's PostgreSQL."""
    made: list[Outbox] = []

    def make(source: str = "shop") -> Outbox:
        store: Outbox
        if request.param == "sqlite":
            store = SQLiteOutbox(tmp_path_factory.mktemp("outbox") / "outbox.sqlite", source=source)
        else:
            store = PostgresOutbox(request.getfixturevalue("postgres_schema")(), source=source)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def outbox(new_outbox: OutboxFactory) -> Outbox:
    store = new_outbox()
    with store.transaction() as transaction:
        transaction.connection.execute("CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)")
    return store


def test_business_rows_and_outbox_rows_commit_together(outbox: Outbox) -> None:
    signalled: list[int] = []
    with write(outbox, notify=signalled.append) as transaction:
        transaction.connection.execute("INSERT INTO orders VALUES ('o-1', 10)")
        first = transaction.add(b"created", key="o-1")
        second = transaction.add_json({"order": "o-1", "total": 10}, key="o-1", headers={"trace": b"\x00\xff"})
    assert (first, second) == (1, 2)
    assert signalled == [2]
    batch = outbox.fetch_batch(10)
    assert [row.id for row in batch.rows] == [1, 2]
    assert batch.rows[0].key == b"o-1"
    assert batch.rows[0].value == b"created"
    assert orjson.loads(batch.rows[1].value or b"") == {"order": "o-1", "total": 10, OUTBOX_ID_FIELD: 2}
    assert batch.rows[1].headers == (("trace", b"\x00\xff"),)


def test_the_oldest_pending_row_is_the_lowest_id_not_yet_sent(outbox: Outbox) -> None:
    assert outbox.oldest_pending_ms() is None
    for value in (b"first", b"second"):
        with write(outbox, notify=lambda _: None) as transaction:
            transaction.add(value, key="o-1")
    first, second = outbox.fetch_batch(10).rows
    assert outbox.oldest_pending_ms() == first.created_ms
    outbox.mark_sent([first.id], now_ms=second.created_ms + 1)
    assert outbox.oldest_pending_ms() == second.created_ms
    outbox.mark_sent([second.id], now_ms=second.created_ms + 2)
    assert (outbox.oldest_pending_ms(), outbox.pending_count()) == (None, 0)


def test_a_failed_transaction_leaves_neither_rows_nor_signal(outbox: Outbox) -> None:
    signalled: list[int] = []

    def place_order() -> None:
        with write(outbox, notify=signalled.append) as transaction:
            transaction.connection.execute("INSERT INTO orders VALUES ('o-2', 20)")
            transaction.add(b"created", key="o-2")
            raise RuntimeError("payment declined")

    with pytest.raises(RuntimeError, match="payment declined"):
        place_order()
    assert signalled == []
    assert outbox.pending_count() == 0
    with outbox.transaction() as transaction:
        assert transaction.connection.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
        assert transaction.add(b"next") == 1  # the rolled-back id is given back: ids stay dense


def test_the_signal_comes_after_the_commit(outbox: Outbox) -> None:
    seen_by_another_thread: list[int] = []

    def notify(offset: int) -> None:
        reader = threading.Thread(target=lambda: seen_by_another_thread.append(outbox.pending_count()))
        reader.start()
        reader.join()

    with write(outbox, notify=notify) as transaction:
        transaction.add(b"x")
    assert seen_by_another_thread == [1]


def test_add_json_refuses_a_payload_that_names_the_id_field(outbox: Outbox) -> None:
    with pytest.raises(ValueError, match=OUTBOX_ID_FIELD), outbox.transaction() as transaction:
        transaction.add_json({OUTBOX_ID_FIELD: 7})
    assert outbox.pending_count() == 0


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12), batch_size=st.integers(1, 7), data=st.data())
def test_fetch_batch_walks_the_outbox_in_id_order(
    new_outbox: OutboxFactory, sizes: list[int], batch_size: int, data: st.DataObject
) -> None:
    store = new_outbox()
    for size in sizes:
        with store.transaction() as transaction:
            for _ in range(size):
                transaction.add(b"v")
    total = sum(sizes)
    assert store.newest_id() == total
    published: list[int] = []
    crashed_last_round = False
    while True:
        batch = store.fetch_batch(batch_size)
        assert [row.id for row in batch.rows] == list(range(len(published) + 1, len(published) + 1 + len(batch.rows)))
        assert batch.drained == (len(batch.rows) < batch_size)
        if batch.drained:
            assert batch.drained_through == total
        elif batch.rows:
            assert batch.drained_through == batch.rows[-1].id
        if not batch.rows:
            break
        # A relay crash between publish and mark (not twice in a row, so the walk ends): the rows come again.
        crashed_last_round = not crashed_last_round and data.draw(st.booleans(), label="crash before mark")
        if not crashed_last_round:
            store.mark_sent([row.id for row in batch.rows], now_ms=1)
            published.extend(row.id for row in batch.rows)
    assert published == list(range(1, total + 1))
    assert store.pending_count() == 0


def test_ids_from_concurrent_writers_are_unique_and_dense(outbox: Outbox) -> None:
    per_writer = 60

    def writer(name: str) -> None:
        for index in range(per_writer):
            with write(outbox, notify=lambda _offset: None) as transaction:
                transaction.add(f"{name}:{index}".encode(), key=name)

    threads = [threading.Thread(target=writer, args=(f"w{number}",)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = outbox.fetch_batch(1_000).rows
    assert [row.id for row in rows] == list(range(1, 4 * per_writer + 1))
    for name in ("w0", "w1", "w2", "w3"):  # each writer's rows keep its own order
        assert [row.value for row in rows if row.key == name.encode()] == [f"{name}:{index}".encode() for index in range(per_writer)]


def test_a_lower_id_is_never_visible_after_a_higher_one(outbox: Outbox) -> None:
    # The relay reads ids in order and reports the highest it read: a row committed later with a lower id
    # would be skipped. A writer holding its first id in an open transaction makes the next writer wait.
    holding = threading.Event()
    release = threading.Event()

    def slow_writer() -> None:
        with outbox.transaction() as transaction:
            transaction.add(b"slow")
            holding.set()
            release.wait(10)

    slow = threading.Thread(target=slow_writer)
    slow.start()
    assert holding.wait(10)
    fast_done = threading.Event()

    def fast_writer() -> None:
        with outbox.transaction() as transaction:
            transaction.add(b"fast")
        fast_done.set()

    fast = threading.Thread(target=fast_writer)
    fast.start()
    time.sleep(0.3)
    assert outbox.fetch_batch(10).rows == ()  # nothing visible while the first writer is open
    assert not fast_done.is_set(), "the second writer committed while the first held a lower id"
    release.set()
    slow.join()
    fast.join()
    assert [(row.id, row.value) for row in outbox.fetch_batch(10).rows] == [(1, b"slow"), (2, b"fast")]


def test_purged_ids_are_never_reused(outbox: Outbox) -> None:
    with outbox.transaction() as transaction:
        for _ in range(3):
            transaction.add(b"v")
    outbox.mark_sent([1, 2, 3], now_ms=100)
    assert outbox.purge_sent(sent_before_ms=101) == 3
    assert outbox.newest_id() == 3  # the relay's high-water mark survives the purge
    with outbox.transaction() as transaction:
        assert transaction.add(b"w") == 4
    assert outbox.fetch_batch(10).drained_through == 4


def test_a_recorded_round_is_kept_until_its_rows_are_marked(outbox: Outbox) -> None:
    with outbox.transaction() as transaction:
        for _ in range(4):
            transaction.add(b"v")
    assert outbox.recorded_round() is None
    outbox.record_round(RelayRound(1, 2, "t", 0, 17))
    outbox.record_round(RelayRound(1, 4, "t", 2, 40))  # a retried round replaces the earlier attempt
    assert outbox.recorded_round() == RelayRound(1, 4, "t", 2, 40)
    outbox.forget_round()
    assert outbox.recorded_round() is None
    outbox.record_round(RelayRound(1, 4, "t", 2, 41))
    outbox.mark_sent([1, 2, 3, 4], now_ms=5)  # the same transaction forgets the round
    assert (outbox.recorded_round(), outbox.pending_count()) == (None, 0)


def test_the_store_reopens_with_its_rows(tmp_path: Path) -> None:
    first = SQLiteOutbox(tmp_path / "o.sqlite")
    with first.transaction() as transaction:
        transaction.add(b"kept")
    first.close()
    again = open_outbox(str(tmp_path / "o.sqlite"))
    try:
        assert [row.value for row in again.fetch_batch(5).rows] == [b"kept"]
    finally:
        again.close()


# --------------------------------------------------------------------------------------------------
# PostgreSQL only: the URL, the NOTIFY doorbell, the relay lock
# --------------------------------------------------------------------------------------------------


def test_a_postgresql_url_opens_the_postgresql_outbox(postgres_schema: Callable[[], str]) -> None:
    url = postgres_schema()
    first = open_outbox(url, source="pg")
    assert isinstance(first, PostgresOutbox)
    with first.transaction() as transaction:
        transaction.add(b"kept")
    first.close()
    again = open_outbox(url)  # the tables exist already: opening again changes nothing
    try:
        assert [row.value for row in again.fetch_batch(5).rows] == [b"kept"]
        assert again.doorbell_path is None
    finally:
        again.close()
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        PostgresOutbox("postgresql://[bad")


def test_notify_reaches_a_listener_at_commit_only(postgres_schema: Callable[[], str]) -> None:
    url = postgres_schema()
    store = PostgresOutbox(url, source="pg", channel="weir_outbox_test_notify")
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN weir_outbox_test_notify")
        with store.transaction() as transaction:
            transaction.add(b"a")
            transaction.add(b"b")
            assert list(listener.notifies(timeout=0.3)) == []  # not before the COMMIT
        heard = list(listener.notifies(timeout=5, stop_after=1))
        assert [(note.channel, note.payload) for note in heard] == [("weir_outbox_test_notify", "2")]
        with store.transaction() as transaction:
            transaction.connection.execute("SELECT 1")  # no outbox row: no ring
        assert list(listener.notifies(timeout=0.3)) == []
    store.close()


def test_one_relay_per_postgresql_outbox(postgres_schema: Callable[[], str]) -> None:
    store = PostgresOutbox(postgres_schema(), source="pg")

    async def scenario() -> None:
        rings: list[int] = []
        first = store.relay_doorbell()
        await first.open(lambda: rings.append(1), lambda error: None)
        try:
            with pytest.raises(RuntimeError, match="another relay holds the advisory lock"):
                await store.relay_doorbell().open(lambda: None, lambda error: None)
            await asyncio.to_thread(_write_one, store)
            for _ in range(100):
                if rings:
                    break
                await asyncio.sleep(0.05)
            # At least this commit's ring: the channel is the database's, so another outbox's commits (another
            # schema, another test run on the same server) may ring it too; a spurious ring only wakes the relay.
            assert rings
        finally:
            await first.close()
        second = store.relay_doorbell()  # the first released the lock when it closed
        await second.open(lambda: None, lambda error: None)
        await second.close()

    asyncio.run(scenario())
    store.close()


def _write_one(store: Outbox) -> None:
    with write(store) as transaction:
        transaction.add(b"x")


def test_doorbell_rings_a_listener_and_never_fails_a_writer(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    bell.ring(1)  # nobody listens: no error
    listener = bell.listen()
    try:
        bell.ring(42)
        listener.settimeout(2)
        listener.setblocking(True)
        assert listener.recv(64) == b"42"
    finally:
        listener.close()
    bell.ring(2)  # the socket file is left behind by a dead listener: still no error
    with pytest.raises(ValueError, match="under 100 bytes"):
        Doorbell(tmp_path / ("x" * 120)).listen()


def test_doorbell_survives_a_full_queue(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "bell")
    listener = bell.listen()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    try:
        for offset in range(5_000):  # far more than the queue holds: rings are dropped, never raised
            bell.ring(offset)
    finally:
        listener.close()


# --------------------------------------------------------------------------------------------------
# The consumer-side dedup
# --------------------------------------------------------------------------------------------------


def headers_for(row_id: int, source: str = "shop") -> list[tuple[str, bytes]]:
    return [("trace", b"t"), (OUTBOX_ID_HEADER, str(row_id).encode()), (OUTBOX_SOURCE_HEADER, source.encode())]


@given(
    row_count=st.integers(1, 60),
    partitions=st.integers(1, 4),
    crashes=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=5),
)
def test_dedup_restores_exactly_once_in_order_after_any_republishing(
    row_count: int, partitions: int, crashes: list[tuple[int, int]]
) -> None:
    """A relay publishes rows 1..n in order; each crash stops after row `stop` and restarts from a row it had
    not marked (at most `stop` + 1). Each partition sees its rows again from there."""
    partition_of: Callable[[int], int] = lambda row_id: (row_id * 7) % partitions  # noqa: E731
    log: list[tuple[int, int]] = []  # (partition, id) in publish order
    position = 1
    for stop_after, back in sorted(crashes):
        stop = min(max(stop_after, position - 1), row_count)
        log.extend((partition_of(row_id), row_id) for row_id in range(position, stop + 1))
        position = max(1, stop + 1 - back)
    log.extend((partition_of(row_id), row_id) for row_id in range(position, row_count + 1))

    dedup = OutboxDedup()
    kept = [(partition, row_id) for partition, row_id in log if dedup.is_new("t", partition, headers_for(row_id))]
    for partition in range(partitions):
        assert [row_id for p, row_id in kept if p == partition] == [
            row_id for row_id in range(1, row_count + 1) if partition_of(row_id) == partition
        ]
    assert dedup.duplicates == len(log) - row_count


def test_dedup_keeps_sources_apart_and_passes_foreign_messages() -> None:
    dedup = OutboxDedup()
    assert dedup.is_new("t", 0, headers_for(5, "a"))
    assert dedup.is_new("t", 0, headers_for(5, "b"))  # another outbox's id 5
    assert not dedup.is_new("t", 0, headers_for(5, "a"))
    assert dedup.is_new("t", 0, None)
    assert dedup.is_new("t", 0, [("other", b"1")])
    assert outbox_id_of(headers_for(9, "a")) == ("a", 9)
    assert dedup.duplicates == 1
