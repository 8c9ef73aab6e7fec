"""Shared pieces of the benchmarks: test messages, worker processes, CPU per process, result collectors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from shop.catalogue import CATALOGUE_CENTS
from weir.app.processes import ROOT

__all__ = [
    "FLAVOURS",
    "Collector",
    "CpuMeter",
    "Proc",
    "broker_pid",
    "end_offsets_total",
    "expected_total_cents",
    "group_settled",
    "order",
    "percentile",
    "record",
    "result_problem",
]

FLAVOURS = ["vanilla", "chocolate", "strawberry", "pistachio", "lemon", "mint"]
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def record(number: int) -> bytes:
    """One of the plain test messages: JSON of 150 to 200 bytes."""
    return orjson.dumps(
        {
            "order_id": f"o-{number:08d}",
            "customer": f"c-{number % 1000:04d}",
            "flavour": FLAVOURS[number % 6],
            "scoops": 1 + number % 3,
            "price_cents": 250 * (1 + number % 3),
            "created_ms": 1_764_450_000_000 + number,
            "note": "two spoons, no cone, extra napkins please",
        }
    )


def order(number: int, items: int) -> bytes:
    """An order of ``items`` items, keyed ``b-<number>`` (the input of both split/aggregate pipelines)."""
    return orjson.dumps(
        {"order_id": f"b-{number}", "items": [{"flavour": FLAVOURS[(number + i) % 6], "scoops": 1 + i % 3} for i in range(items)]}
    )


def expected_total_cents(number: int, items: int) -> int:
    """What the priced items of ``order(number, items)`` add up to, from the catalogue."""
    return sum(CATALOGUE_CENTS[FLAVOURS[(number + i) % 6]] * (1 + i % 3) for i in range(items))


def result_problem(key: str, result: object, items: int) -> str | None:
    """What is wrong with the result of order ``key`` (``b-<number>``) of ``items`` items, None if nothing is.

    Every split/aggregate pipeline measured, weir's or Quix Streams', must answer an order with weir's
    aggregate: status complete, ``items`` items all ok, their prices adding up to the catalogue's total.
    """
    where = f"result of order {key!r}"
    if not isinstance(result, dict):
        return f"{where}: expected a JSON object, got {type(result).__name__}"
    status, count = result.get("status"), result.get("expected_count")
    if status != "complete" or count != items:
        return f"{where}: expected status 'complete' and expected_count {items}, got {status!r} and {count!r}"
    entries = result.get("items")
    indexes = [entry.get("index") if isinstance(entry, dict) else None for entry in entries] if isinstance(entries, list) else None
    if entries is None or indexes != list(range(items)):
        return f"{where}: expected items with indexes 0..{items - 1}, got {entries!r}"
    if any(entry.get("status") != "ok" or not isinstance(entry.get("result"), dict) for entry in entries):
        return f"{where}: expected every item 'ok' with a result, got {entries!r}"
    total = sum(entry["result"].get("price_cents", 0) for entry in entries)
    expected = expected_total_cents(int(key.removeprefix("b-")), items)
    if total != expected:
        return f"{where}: its items' price_cents add up to {total}, but the order's catalogue total is {expected}"
    return None


async def group_settled(
    bootstrap: str, group: str, members: int, timeout_s: float = 120.0, alive: Callable[[], None] | None = None
) -> None:
    """Waits until the consumer group ``group`` is Stable with ``members`` members, each given an assignment: every
    process of a pipeline owns its share before it is measured (a process that joins late would otherwise watch a
    short backlog go by on its peers, and the CPU per order would be one process's)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    deadline = time.monotonic() + timeout_s
    seen = "nothing"
    try:
        while True:
            if alive is not None:
                alive()
            with contextlib.suppress(Exception):  # the group's coordinator may not be known yet
                for response in await admin.describe_consumer_groups([group]):
                    for _error, _group, state, _kind, _protocol, group_members, *_ in response.groups:
                        assigned = sum(1 for member in group_members if member[4])
                        seen = f"{state} with {len(group_members)} members, {assigned} assigned"
                        if state == "Stable" and len(group_members) == members == assigned:
                            return
            if time.monotonic() > deadline:
                message = f"group {group}: not Stable with {members} assigned members after {timeout_s:g} s (last: {seen})"
                raise TimeoutError(message)
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def broker_pid() -> int | None:
    """The local broker's pid (scripts/broker.sh writes it), None when KAFKA_BOOTSTRAP names another broker.

    With KAFKA_BOOTSTRAP and WEIR_STATE_DIR both set, the broker is another local scripts/broker.sh instance
    (its own WEIR_KAFKA_PORT and state dir): its pid file is in that state dir.
    """
    if os.environ.get("KAFKA_BOOTSTRAP") and not os.environ.get("WEIR_STATE_DIR"):
        return None
    pidfile = Path(os.environ.get("WEIR_STATE_DIR", str(ROOT / ".weir"))) / "kafka.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of the whole process (all its threads), from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass
class CpuMeter:
    """CPU used by named processes over an interval, as a percentage of one core (and in seconds: ``seconds``).

    Each process is measured alone (its own utime + stime, all its threads: librdkafka's and RocksDB's
    included), not its children: the workers measured (``faust worker``, ``python -m bench.quix_split_aggregate``)
    start none.
    """

    pids: dict[str, int]
    _start: dict[str, float | None] = field(default_factory=dict)
    _started: float = 0.0
    #: CPU seconds each process used over the interval, set by :meth:`stop`.
    seconds: dict[str, float] = field(default_factory=dict)

    def start(self) -> CpuMeter:
        self._start = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        self._started = time.monotonic()
        return self

    def stop(self) -> dict[str, float]:
        elapsed = max(1e-6, time.monotonic() - self._started)
        self.seconds = {}
        for name, pid in self.pids.items():
            before, after = self._start.get(name), _cpu_seconds(pid)
            if before is not None and after is not None:
                self.seconds[name] = after - before
        return {name: 100 * seconds / elapsed for name, seconds in self.seconds.items()}


@dataclass
class Proc:
    """A worker process in its own session (so stop() ends it and its children), output to ``log_path``."""

    command: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Proc:
        self._log = self.log_path.open("ab")
        env = {"PYTHONPATH": str(ROOT), **self.env}
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            message = f"{self.command[:4]} exited with {self.process.returncode} ({self.log_path}):\n{self.log_text()[-3000:]}"
            raise RuntimeError(message)

    def wait_for_log(self, marker: str, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while marker not in self.log_text():
            self.check_alive()
            if time.monotonic() > deadline:
                message = f"{self.command[:4]}: no {marker!r} after {timeout_s}s ({self.log_path}):\n{self.log_text()[-3000:]}"
                raise RuntimeError(message)
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


async def end_offsets_total(consumer: AIOKafkaConsumer, topic: str, partitions: int) -> int:
    offsets = await consumer.end_offsets([TopicPartition(topic, number) for number in range(partitions)])
    return sum(offsets.values())


def _record_key(message: ConsumerRecord[bytes, bytes]) -> str | None:
    return message.key.decode() if message.key is not None else None


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 30.0) -> list[TopicPartition]:
    """Every partition of ``topic`` as the broker lists it now (a metadata request of the started ``consumer``; a
    subscribed consumer's own metadata knows only its subscription)."""
    deadline = time.monotonic() + timeout_s
    while not (ids := (await consumer._client.fetch_all_metadata()).partitions_for_topic(topic)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no partition of {topic!r} after {timeout_s:g} s (not created?)")
        await asyncio.sleep(0.05)
    return [TopicPartition(topic, number) for number in sorted(ids)]


class Collector:
    """Reads a topic from its beginning (read_committed) and notes when each key was first seen (wall clock).

    ``key_of`` names a record another way than by its key (None: not counted), e.g. by fields of its value.
    """

    def __init__(self, bootstrap: str, topic: str, key_of: Callable[[ConsumerRecord[bytes, bytes]], str | None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.key_of = key_of or _record_key
        self.seen: dict[str, float] = {}
        #: the create time of the record each key was first seen in (the producer's clock when it built the batch)
        self.stamped: dict[str, float] = {}
        #: the (partition, offset) of the record each key was first seen in
        self.placed: dict[str, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        #: where the reader started in each partition
        self._starts: dict[int, int] = {}

    async def start(self, *, from_end: bool = False) -> Collector:
        """Read the topic from its beginning, or (``from_end``) only what comes after this call returns.

        From the beginning, a run that follows others on the same topic first reads all of their records:
        the first results of the run are then seen late (a 10,000-order backlog before a 20 orders/s run
        made its p99 of 200 orders 200-400 ms where it was 16 ms). From the end, the reader is at the end of
        every partition (the last stable offset: read_committed), and a fetch of each has been answered, before the call
        returns.

        The partitions are assigned and their offsets set here, before any fetch, not left to aiokafka: subscribed in no
        group, with ``auto_offset_reset="earliest"`` and ``seek_to_end``, the reader of a run after a backlog read the
        whole topic from its beginning first in two of three runs (thousands of records a fetch before the first order
        was sent): the first results of a 20 orders/s run were seen 0.3-1.7 s after the worker had committed them, more
        run after run as the topic grew, while a second reader saw their last stable offset pass them within 40 ms; a
        backlog run's rate was the reader's. A record before where it started is an error (:meth:`_run`), not
        something to skip.
        """
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="none",
            enable_auto_commit=False,
            isolation_level="read_committed",
            group_id=None,
            fetch_max_wait_ms=50,
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + 30
            partitions = await topic_partitions(consumer, self.topic)
            # where to start, read before the partitions are assigned and set with no await between: nothing of the
            # consumer's own (a reset to auto_offset_reset) can come first
            starts = await (consumer.end_offsets(partitions) if from_end else consumer.beginning_offsets(partitions))
            consumer.assign(partitions)
            for partition, offset in starts.items():
                consumer.seek(partition, offset)
            self._starts = {partition.partition: offset for partition, offset in starts.items()}
            if from_end:
                # A first fetch answered for every partition (its last stable offset known) before the clock starts: a
                # new reader's first fetches took up to 350 ms in half the runs, and the first orders of a 20 orders/s
                # run, their results committed within 5 ms, were seen that late (their p99 was the reader's start).
                while any(consumer.last_stable_offset(partition) is None for partition in partitions):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"collector: no fetch of {self.topic!r} answered after 30 s")
                    await asyncio.sleep(0.01)
        except BaseException:
            await consumer.stop()
            raise
        self._task = asyncio.create_task(self._run(consumer))
        return self

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=100, max_records=5000)
                now = time.time()
                for partition, messages in batch.items():
                    if messages and messages[0].offset < self._starts[partition.partition]:
                        raise RuntimeError(
                            f"collector: {self.topic!r} partition {partition.partition} read from offset {messages[0].offset},"
                            f" before where it started ({self._starts[partition.partition]})"
                        )
                    for message in messages:
                        key = self.key_of(message)
                        if key is not None and key not in self.seen:
                            self.seen[key] = now
                            self.placed[key] = (message.partition, message.offset)
                            self.stamped[key] = message.timestamp / 1000
                if batch:
                    self._changed.set()
        finally:
            await consumer.stop()

    async def wait_for(self, keys: Iterable[str], timeout_s: float, alive: Callable[[], None] | None = None) -> bool:
        """True when every key was seen, False after the timeout; ``alive()`` may raise (a worker died)."""
        wanted = set(keys)
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.seen.keys():
            if alive is not None:
                alive()
            if self._task is not None and self._task.done():
                self._task.result()  # the reader's error; a reader that ended without one is one too
                raise RuntimeError(f"collector: the reader of {self.topic!r} ended")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))
        return True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
