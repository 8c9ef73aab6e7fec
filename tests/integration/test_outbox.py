"""The outbox relay end to end on the real broker, over SQLite and the real PostgreSQL: concurrent writers, prompt
wake-ups (the Unix doorbell, LISTEN/NOTIFY), a SIGKILLed relay process, a crash between the Kafka commit and the mark."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.conftest import ROOT
from tests.integration.local_broker import BrokerInstance
from weir.app.kafka_io import ensure_topics
from weir.app.outbox import OUTBOX_ID_FIELD, Outbox, OutboxDedup, OutboxRelay, OutboxRow, open_outbox, outbox_id_of, write

pytestmark = pytest.mark.integration

PARTITIONS = 3


def unique_topic() -> str:
    return f"t{uuid.uuid4().hex[:8]}.outbox"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Test-side wait (the relay itself never polls)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            message = f"timed out after {timeout_s}s waiting for {what}"
            raise AssertionError(message)
        time.sleep(poll_s)


async def _read_all(bootstrap: str, topic: str, isolation_level: str) -> list[Any]:
    """Every message of ``topic``, up to the end offsets at the time of the call."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, isolation_level=isolation_level)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, number) for number in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        messages: list[Any] = []
        deadline = time.monotonic() + 60
        while [partition for partition in partitions if await consumer.position(partition) < ends[partition]]:
            assert time.monotonic() < deadline, f"reading {topic}: not at the end offsets {ends} after 60s"
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                messages.extend(batch)
        return messages
    finally:
        await consumer.stop()


def read_all(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> list[Any]:
    return asyncio.run(_read_all(bootstrap, topic, isolation_level))


async def _end_offset_total(bootstrap: str, topic: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, number) for number in range(PARTITIONS)]
        return sum((await consumer.end_offsets(partitions)).values())
    finally:
        await consumer.stop()


def check_arrivals(messages: Sequence[Any], expected_ids: Sequence[int]) -> OutboxDedup:
    """After dedup: every outbox id exactly once, and each aggregate (key) in its writer's order."""
    dedup = OutboxDedup()
    seen_ids: set[int] = set()
    kept: list[Any] = []
    for message in sorted(messages, key=lambda record: (record.partition, record.offset)):
        found = outbox_id_of(message.headers)
        assert found is not None, f"message at {message.partition}:{message.offset} has no outbox id header"
        payload = orjson.loads(message.value)
        assert payload[OUTBOX_ID_FIELD] == found[1], "the header and the value name different outbox ids"
        if dedup.accept(message):
            kept.append(payload)
            seen_ids.add(found[1])
        else:
            assert found[1] in seen_ids, f"a dropped duplicate {found[1]} had not been delivered before"
    assert sorted(payload[OUTBOX_ID_FIELD] for payload in kept) == list(expected_ids)
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for payload in kept:
        by_key[payload["writer"]].append(payload)
    for writer, payloads in by_key.items():
        assert [payload["seq"] for payload in payloads] == list(range(len(payloads))), f"writer {writer}: out of order"
        assert [payload[OUTBOX_ID_FIELD] for payload in payloads] == sorted(payload[OUTBOX_ID_FIELD] for payload in payloads)
    return dedup


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def outbox_location(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where this test's outbox lives: a SQLite file, or a fresh schema on the session's PostgreSQL."""
    if store_kind == "sqlite":
        return str(tmp_path / "outbox.sqlite")
    return str(request.getfixturevalue("postgres_schema")())


def store_name(location: str) -> str:
    return "postgresql" if location.startswith("postgresql://") else "sqlite"


def placeholder(location: str) -> str:
    """The business SQL's parameter marker: sqlite3 takes ``?``, psycopg ``%s``."""
    return "%s" if location.startswith("postgresql://") else "?"


def unique_source(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


class RelayThread:
    """An OutboxRelay running in its own thread and event loop, recording when each row was acknowledged."""

    def __init__(self, outbox: Outbox, bootstrap: str, topic: str, *, batch_size: int = 200) -> None:
        self.acked_at: dict[int, float] = {}  # row id -> time.time() of the broker's ack
        self.changed = threading.Condition()
        self.asleep = threading.Event()
        self.relay = OutboxRelay(
            outbox,
            bootstrap=bootstrap,
            topic=topic,
            batch_size=batch_size,
            safety_timeout_s=30.0,
            on_published=self._published,
            on_sleep=lambda _processed: self.asleep.set(),
        )
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="outbox-relay")

    def _run(self) -> None:
        try:
            asyncio.run(self.relay.run())
        except BaseException as error:
            self.failure = error
            self.asleep.set()

    def _published(self, rows: Sequence[OutboxRow]) -> None:
        now = time.time()
        with self.changed:
            for row in rows:
                self.acked_at[row.id] = now
            self.changed.notify_all()

    def wait_acked(self, count: int, timeout_s: float) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.acked_at) >= count or self.failure is not None, timeout_s), (
                f"only {len(self.acked_at)} of {count} rows acknowledged after {timeout_s}s ({self.relay.stats})"
            )
        assert self.failure is None, f"the relay failed: {self.failure!r}"

    def __enter__(self) -> RelayThread:
        self.thread.start()
        assert self.asleep.wait(30), "the relay did not drain its empty outbox and sleep"
        assert self.failure is None, f"the relay failed: {self.failure!r}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.relay.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the relay did not stop"


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = unique_topic()
    asyncio.run(ensure_topics(kafka_bootstrap, [name], PARTITIONS))
    return name


def test_writer_threads_arrive_in_order_exactly_once_and_wake_the_sleeping_relay(
    kafka_bootstrap: str, topic: str, outbox_location: str
) -> None:
    outbox = open_outbox(outbox_location, source=unique_source("threads"))
    mark = placeholder(outbox_location)
    with outbox.transaction() as transaction:
        transaction.connection.execute("CREATE TABLE orders (writer TEXT, seq INTEGER)")
    writers, transactions_each = 4, 100

    with RelayThread(outbox, kafka_bootstrap, topic) as relay:

        def writer(name: str) -> None:
            jitter = random.Random(name)
            for seq in range(transactions_each):
                with write(outbox, notify=relay.relay.signal) as transaction:
                    transaction.connection.execute(f"INSERT INTO orders VALUES ({mark}, {mark})", (name, seq))
                    transaction.add_json({"writer": name, "seq": seq}, key=name)
                if jitter.random() < 0.1:
                    time.sleep(jitter.random() * 0.02)

        started = time.monotonic()
        threads = [threading.Thread(target=writer, args=(f"writer-{number}",)) for number in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        relay.wait_acked(writers * transactions_each, timeout_s=60)
        concurrent_s = time.monotonic() - started

        # Wake latency: a row written while the relay sleeps, from COMMIT to the broker's ack.
        latencies: list[float] = []
        for seq in range(20):
            assert relay.asleep.wait(30), "the relay did not go back to sleep"
            relay.asleep.clear()
            committed_at = time.time()
            with write(outbox, notify=relay.relay.signal) as transaction:
                transaction.add_json({"writer": "lone", "seq": seq}, key="lone")
            relay.wait_acked(writers * transactions_each + seq + 1, timeout_s=10)
            latencies.append(relay.acked_at[writers * transactions_each + seq + 1] - committed_at)
        stats = relay.relay.stats

    total = writers * transactions_each + 20
    print(
        f"\n[outbox threads] {writers} writers x {transactions_each} rows in {concurrent_s:.2f}s; wake latency (commit -> ack) "
        f"p50 {statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; {stats}"
    )
    assert max(latencies) < 5.0
    assert stats.safety_wakes == 0, "a row waited for the safety timer: a wake-up was lost"
    assert stats.signal_wakes >= 20
    assert stats.sleeps >= 21
    assert outbox.pending_count() == 0
    dedup = check_arrivals(read_all(kafka_bootstrap, topic), range(1, total + 1))
    assert dedup.duplicates == 0  # no crash here: the idempotent producer sent each row once
    outbox.close()


WRITER_PROCESS = textwrap.dedent(
    """
    import random, sys, time
    from weir.app.outbox import open_outbox, write
    location, source, name, count, mark = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    outbox = open_outbox(location, source=source)
    jitter = random.Random(name)
    for seq in range(count):
        with write(outbox) as transaction:  # the default signal: the doorbell (SQLite) or NOTIFY at commit (PostgreSQL)
            row_id = transaction.add_json({"writer": name, "seq": seq}, key=name)
            values = (row_id, name, seq, time.time())
            transaction.connection.execute(f"INSERT INTO orders VALUES ({mark}, {mark}, {mark}, {mark})", values)
        time.sleep(jitter.random() * 0.03)
    outbox.close()
    """
)


def test_writer_processes_wake_the_relay_through_the_doorbell(kafka_bootstrap: str, topic: str, outbox_location: str) -> None:
    source = unique_source("processes")
    outbox = open_outbox(outbox_location, source=source)
    with outbox.transaction() as transaction:
        transaction.connection.execute("CREATE TABLE orders (outbox_id INTEGER, writer TEXT, seq INTEGER, committed_at DOUBLE PRECISION)")
    writers, rows_each = 3, 150
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    with RelayThread(outbox, kafka_bootstrap, topic) as relay:
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER_PROCESS,
                    outbox_location,
                    source,
                    f"proc-{number}",
                    str(rows_each),
                    placeholder(outbox_location),
                ],
                cwd=ROOT,
                env=env,
            )
            for number in range(writers)
        ]
        for process in processes:
            assert process.wait(120) == 0
        relay.wait_acked(writers * rows_each, timeout_s=60)
        stats = relay.relay.stats
        with outbox.transaction() as transaction:
            committed = transaction.connection.execute("SELECT outbox_id, committed_at FROM orders ORDER BY outbox_id").fetchall()
        latencies = [relay.acked_at[row_id] - committed_at for row_id, committed_at in committed]

    print(
        f"\n[outbox processes] {writers} writer processes x {rows_each} rows; "
        f"commit -> ack p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {statistics.quantiles(latencies, n=100)[98] * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; {stats}"
    )
    assert max(latencies) < 5.0
    assert stats.safety_wakes == 0, "a row waited for the safety timer: a doorbell ring was lost"
    assert stats.signal_wakes >= 1  # it slept between bursts and the doorbell woke it
    check_arrivals(read_all(kafka_bootstrap, topic), range(1, writers * rows_each + 1))
    outbox.close()


class RelayProcess:
    """``python -m app.outbox_relay`` in its own session, so a SIGKILL takes the whole process group."""

    def __init__(self, db: str, source: str, topic: str, bootstrap: str, log_path: Path, batch: int) -> None:
        self.command = [
            sys.executable,
            "-m",
            "weir.app.outbox_relay",
            "--db",
            db,
            "--source",
            source,
            "--topic",
            topic,
            "--batch",
            str(batch),
        ]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "KAFKA_BOOTSTRAP": bootstrap}
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RelayProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def send(self, signum: signal.Signals) -> int:
        assert self.process is not None
        os.killpg(self.process.pid, signum)
        return self.process.wait(30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def relay_processes() -> Iterator[list[RelayProcess]]:
    started: list[RelayProcess] = []
    yield started
    for relay in started:
        if relay.process is not None and relay.process.poll() is None:
            relay.send(signal.SIGKILL)


def marked_sent(outbox: Outbox) -> int:
    """Rows marked sent: the newest id less the pending rows, read with no row written in between.

    The writer thread keeps adding rows: a row added between the two reads counted as pending but not in the
    newest id, and the difference came out 10 short (a CI failure in session 10).
    """
    while True:
        newest = outbox.newest_id()
        pending = outbox.pending_count()
        if outbox.newest_id() == newest:
            return newest - pending


def write_rows(outbox: Outbox, sequence: dict[str, int], count: int, keys: int = 5) -> None:
    """``count`` rows in one outbox transaction, each for one of ``keys`` writers with that writer's next sequence number
    (``check_arrivals`` checks each writer's order). The commit rings a relay process's doorbell."""
    with write(outbox) as transaction:
        for _ in range(count):
            key = f"key-{random.randrange(keys)}"
            transaction.add_json({"writer": key, "seq": sequence[key]}, key=key)
            sequence[key] += 1


def test_a_relay_process_killed_mid_run_publishes_each_row_once_for_read_committed(
    kafka_bootstrap: str, topic: str, tmp_path: Path, outbox_location: str, relay_processes: list[RelayProcess]
) -> None:
    source = unique_source("crash")
    outbox = open_outbox(outbox_location, source=source)
    batch, backlog_transactions, rows_per_transaction = 1_000, 400, 100
    sequence: dict[str, int] = defaultdict(int)
    for _ in range(backlog_transactions):
        write_rows(outbox, sequence, rows_per_transaction)
    backlog = backlog_transactions * rows_per_transaction

    stop_writing = threading.Event()

    def keep_writing() -> None:  # rows keep coming across the crash and the restart
        while not stop_writing.is_set():
            write_rows(outbox, sequence, 10)
            time.sleep(0.02)

    first = RelayProcess(outbox_location, source, topic, kafka_bootstrap, tmp_path / "relay-1.log", batch).start()
    relay_processes.append(first)
    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        wait_until(lambda: asyncio.run(_end_offset_total(kafka_bootstrap, topic)) >= 3_000, 60, "the first relay to publish 3,000 rows")
        assert first.send(signal.SIGKILL) == -signal.SIGKILL
        on_topic_at_kill = asyncio.run(_end_offset_total(kafka_bootstrap, topic))
        marked_at_kill = marked_sent(outbox)
        assert outbox.pending_count() > 0, "the relay had drained everything before the kill: raise the backlog"
        assert marked_at_kill < backlog

        second = RelayProcess(outbox_location, source, topic, kafka_bootstrap, tmp_path / "relay-2.log", batch).start()
        relay_processes.append(second)
        pending_at_restart, restarted = outbox.pending_count(), time.monotonic()
        wait_until(lambda: outbox.pending_count() == 0, 120, "the restarted relay to drain the backlog", poll_s=0.01)
        drained_s = time.monotonic() - restarted
        time.sleep(1.0)  # a second of live writes on the restarted relay
    finally:
        stop_writing.set()
        writer.join()
    wait_until(lambda: outbox.pending_count() == 0, 30, "the last live rows")
    assert second.send(signal.SIGTERM) == 0, f"the relay did not stop cleanly on SIGTERM:\n{second.log_text()[-3000:]}"
    assert "outbox relay stopped" in second.log_text()

    total = outbox.newest_id()
    messages = read_all(kafka_bootstrap, topic)
    dedup = check_arrivals(messages, range(1, total + 1))
    uncommitted = read_all(kafka_bootstrap, topic, "read_uncommitted")
    check_arrivals(uncommitted, range(1, total + 1))  # the killed round's aborted copies: OutboxDedup drops them
    print(
        f"\n[outbox crash {store_name(outbox_location)}] {total} rows; at the SIGKILL {on_topic_at_kill} messages on the topic "
        f"(committed or not) and {marked_at_kill} rows marked sent; read_committed: {len(messages)} messages, "
        f"{dedup.duplicates} duplicates; read_uncommitted: {len(uncommitted)}; restarted relay drained "
        f"{pending_at_restart} pending rows in {drained_s:.2f}s (including its start-up) = {pending_at_restart / drained_s:.0f} rows/s"
    )
    assert dedup.duplicates == 0, "a read_committed consumer saw a row twice"
    assert len(messages) == total
    assert len(uncommitted) - total <= batch, "only the round the kill interrupted is there twice, aborted"
    outbox.close()


class FailOnce:
    """Wraps an outbox so that the first call of ``method`` fails after doing its work (a crash just after it)."""

    def __init__(self, outbox: Outbox, method: str) -> None:
        self.outbox, self.method, self.failed = outbox, method, False

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.outbox, name)
        if name != self.method or self.failed:
            return found

        def fail_after(*args: Any, **kwargs: Any) -> Any:
            self.failed = True
            found(*args, **kwargs)
            message = f"simulated crash after {name}"
            raise RuntimeError(message)

        return fail_after


def test_a_round_recorded_but_not_committed_is_published_again_in_a_new_transaction(
    kafka_bootstrap: str, topic: str, outbox_location: str
) -> None:
    outbox = open_outbox(outbox_location, source=unique_source("doubt"))
    with outbox.transaction() as transaction:
        for seq in range(30):
            transaction.add_json({"writer": "w", "seq": seq}, key="w")
    flaky: Any = FailOnce(outbox, "record_round")  # fails before the Kafka commit: the attempt is aborted
    with RelayThread(flaky, kafka_bootstrap, topic, batch_size=20) as relay_thread:
        relay_thread.wait_acked(30, timeout_s=30)
        stats = relay_thread.relay.stats
    assert (outbox.pending_count(), outbox.recorded_round(), stats.publish_failures) == (0, None, 1)
    assert check_arrivals(read_all(kafka_bootstrap, topic), range(1, 31)).duplicates == 0
    assert len(read_all(kafka_bootstrap, topic, "read_uncommitted")) == 50  # plus the aborted attempt's 20
    outbox.close()


def test_a_round_committed_but_not_marked_is_settled_at_restart_not_published_again(
    kafka_bootstrap: str, topic: str, outbox_location: str
) -> None:
    outbox = open_outbox(outbox_location, source=unique_source("doubt"))
    with outbox.transaction() as transaction:
        for seq in range(30):
            transaction.add_json({"writer": "w", "seq": seq}, key="w")
    real_mark_sent = outbox.mark_sent

    def no_mark(ids: Any, *, now_ms: int) -> None:
        message = "simulated crash after the Kafka commit, before the mark"
        raise RuntimeError(message)

    outbox.mark_sent = no_mark  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="simulated crash"):
        asyncio.run(OutboxRelay(outbox, bootstrap=kafka_bootstrap, topic=topic, batch_size=20).run())
    outbox.mark_sent = real_mark_sent  # type: ignore[method-assign]
    recorded = outbox.recorded_round()
    assert recorded is not None
    assert (recorded.first_id, recorded.last_id, outbox.pending_count()) == (1, 20, 30)

    with RelayThread(outbox, kafka_bootstrap, topic, batch_size=20) as relay_thread:
        relay_thread.wait_acked(10, timeout_s=30)
        stats = relay_thread.relay.stats
    assert (outbox.pending_count(), outbox.recorded_round(), stats.rows_published) == (0, None, 10)  # 1..20 settled, not resent
    assert check_arrivals(read_all(kafka_bootstrap, topic), range(1, 31)).duplicates == 0
    assert len(read_all(kafka_bootstrap, topic, "read_uncommitted")) == 30
    outbox.close()


def test_a_relay_through_a_broker_sigkill_publishes_each_row_once_for_read_committed(
    tmp_path: Path, relay_processes: list[RelayProcess]
) -> None:
    """The relay's broker (a private one) is SIGKILLed while rows keep coming and starts again on its data 8 s later: the
    relay waits for it and goes on, without being restarted; after dedup every row arrives once, in its writer's order."""
    broker = BrokerInstance(tmp_path / "broker").start()
    stop_writing = threading.Event()
    writer: threading.Thread | None = None
    try:
        topic = unique_topic()
        asyncio.run(ensure_topics(broker.bootstrap, [topic], PARTITIONS))
        location, source = str(tmp_path / "outbox.sqlite"), unique_source("broker-kill")
        outbox = open_outbox(location, source=source)
        sequence: dict[str, int] = defaultdict(int)

        def keep_writing() -> None:  # rows keep coming before, during and after the broker's outage
            while not stop_writing.is_set():
                write_rows(outbox, sequence, 10)
                time.sleep(0.02)

        relay = RelayProcess(location, source, topic, broker.bootstrap, tmp_path / "relay.log", 1_000).start()
        relay_processes.append(relay)
        writer = threading.Thread(target=keep_writing)
        writer.start()
        wait_until(lambda: asyncio.run(_end_offset_total(broker.bootstrap, topic)) >= 1_000, 60, "the relay to publish 1,000 rows")
        broker.kill()
        time.sleep(8.0)
        pending_while_down = outbox.pending_count()
        assert pending_while_down > 0, "rows written while the broker was down wait for it"
        broker.start()
        time.sleep(2.0)  # live writes on the broker that came back
        stop_writing.set()
        writer.join()
        wait_until(lambda: outbox.pending_count() == 0, 120, "the relay to publish every row after the broker came back")
        assert relay.process is not None
        assert relay.process.poll() is None, f"the relay stopped:\n{relay.log_text()[-3000:]}"
        total = outbox.newest_id()
        messages = read_all(broker.bootstrap, topic)
        dedup = check_arrivals(messages, range(1, total + 1))
        print(f"\n[outbox broker SIGKILL] {total} rows, {pending_while_down} pending before the broker came back", end="")
        print(f"; {dedup.duplicates} duplicates dropped")
    finally:
        stop_writing.set()
        if writer is not None:
            writer.join()
        broker.stop()  # the relay is SIGKILLed by the relay_processes fixture
