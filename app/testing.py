"""The in-process test driver: a user's flows run on weir's own stage code with in-memory topics and a virtual clock.

Like Kafka Streams' ``TopologyTestDriver``: no broker, no worker process. The flows are compiled by the same
:class:`app.flow_topology.FlowTopology` a worker compiles them with, and each stage's part handler (decoding, dead
letters, the keyed-state runtime, retries, deadlines) is the worker's; only the clock and where records go differ
(:mod:`app.runtime.environment`). A behaviour that differs between the driver and a worker is a bug in one of them.

What it models of a worker under exactly-once:

* **Topics** are logs per partition; a record's partition is its key's (the producers' murmur2), as in Kafka.
* **Rounds**: each stage takes what its source partitions hold past its position, one part per partition in offset
  order, and handles it; then the round commits: the records it wrote become visible (read_committed), the tables'
  state and the positions are kept as the last commit. Stages only ever read committed records.
* **A crash** (:meth:`TestDriver.crash_after`) stops a round after some events, before its commit: the records the
  round wrote are aborted (never visible), the tables go back to the last commit, the positions too; the restarted
  stages read the same inputs again. Exactly-once means the outcome is the same as without the crash.
* **Time** is virtual: :meth:`TestDriver.advance` moves it in steps of the tick interval, each step sending a tick
  to every partition of every ticked topic (deadlines, timeouts); a retry's backoff moves it as it waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from faust.types import EventT

from weir.app.codec import dumps, loads
from weir.app.eof_gateway import client_messages, delivered_message
from weir.app.eof_topology import EofTopology, topic_base
from weir.app.flow_topology import FlowTopology
from weir.app.flows import Flow
from weir.app.kafka_io import key_partition
from weir.app.pipeline import PipelineTopology
from weir.app.runtime import environment
from weir.app.settings import Settings
from weir.app.stages import Stage, Wiring
from weir.app.trigger_status import StatusSource
from weir.app.trigger_topology import TriggerTopology
from weir.app.windows import Window, WindowTopology
from weir.tables.eof import TOPIC_REPORTS, EofJob, ReportDesk

__all__ = ["TestDriver", "TestRecord", "VirtualClock", "Crashed"]

#: Where the virtual clock starts: 2023-11-14T22:13:20Z, a fixed instant so that runs repeat.
START_MS = 1_700_000_000_000


class VirtualClock:
    """A clock that moves only when told (:meth:`advance`), or when code waits on it (a retry's backoff).

    Waits that overlap (items retried at once) move it to the latest of their ends, not the sum of them.
    """

    def __init__(self, start_ms: int = START_MS) -> None:
        self.now = start_ms

    def now_ms(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + int(seconds * 1000)
        await asyncio.sleep(0)
        self.now = max(self.now, until)

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass(frozen=True)
class TestRecord:
    """A record as a test reads it: the key and header values as text, the value decoded from JSON (or the bytes)."""

    __test__ = False  # not a pytest class

    topic: str
    partition: int
    offset: int
    key: str | None
    value: Any
    headers: dict[str, str] = field(default_factory=dict)


class Crashed(Exception):
    """Raised inside a round by a crash the test asked for (:meth:`TestDriver.crash_after`)."""


@dataclass
class _Record:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    committed: bool = False
    aborted: bool = False
    #: the record's timestamp (ms): the clock's when it was written, or the one the test gave
    timestamp_ms: int = 0


@dataclass(frozen=True)
class _TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True)
class _Message:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    #: seconds, as Faust's ``Message.timestamp``
    timestamp: float = 0.0

    @property
    def tp(self) -> _TopicPartition:
        return _TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class _Event:
    """What a stage's code reads of a Faust event: its message."""

    message: _Message


@dataclass(frozen=True)
class _TopicRef:
    """A topic as a topology holds it: its full name."""

    name: str

    def get_topic_name(self) -> str:
        return self.name


class _MemoryTable(dict[str, Any]):
    """A table of the driver: string keys, JSON values, named and described as a worker's."""

    def __init__(self, name: str, help_text: str) -> None:
        super().__init__()
        self.name = name
        self.help = help_text


class _Outlet:
    """The driver's topics as the environment's outlet: records go into the round's open transaction."""

    def __init__(self, driver: TestDriver, dead_letters: _TopicRef) -> None:
        self.driver = driver
        self.dead_letters = dead_letters

    async def send(
        self, topic: Any, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None, partition: int | None
    ) -> None:
        self.driver._append(topic.get_topic_name(), key, value, list(headers or ()), partition, committed=False)

    def partitions(self, topic: str) -> int | None:
        return self.driver.settings.partitions

    async def signal(self, topic: Any, value: bytes, partition: int) -> None:
        self.driver._append(topic.get_topic_name(), None, value, [], partition, committed=True)


class TestDriver:
    """Runs ``flows``, end-of-stream jobs, the split/aggregate pipeline and the counter triggers in this process: pipe
    records in, advance time, read outputs, dead letters and tables.

    ``settings``: the settings they run with (partitions, retry policy, tick interval, chunk and bundle sizes, EOF
    timeouts, topic prefix...; :class:`app.settings.Settings`' defaults otherwise). ``eof_jobs``: end-of-stream jobs
    by name (``""``: the unnamed job, whose topics carry no job name), as a deployment's ``WEIR_EOF_JOB``.
    ``item_step``: runs the split/aggregate pipeline with this item step (``WEIR_ITEM_PROCESSOR``; orders on
    ``orders``, results on ``aggregates``). ``triggers``: runs the counter triggers (registrations and completions on
    ``triggers``, wakes on ``trigger-fired``), the safety sweep reading ``status_source``. ``topologies``: a package's
    own stages (built with :func:`app.keyed_stage.keyed_stage`, say), each a function of the driver's wiring that
    returns something with ``stages()``. ``windows``: windowed aggregations on event time (:class:`app.windows.Window`;
    a record's timestamp is the clock's when it is piped, or ``pipe(..., timestamp_ms=)``). Topic
    names given to and returned by the driver are without the settings' prefix. Use it as a context manager, or call
    :meth:`close`.
    """

    __test__ = False  # not a pytest class

    def __init__(
        self,
        flows: Sequence[Flow] = (),
        settings: Settings | None = None,
        *,
        eof_jobs: Mapping[str, EofJob] | None = None,
        item_step: Callable[[Any], Any] | None = None,
        triggers: bool = False,
        status_source: StatusSource | None = None,
        topologies: Sequence[Callable[[Wiring], Any]] = (),
        windows: Sequence[Window] = (),
        start_ms: int = START_MS,
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        self.clock = VirtualClock(start_ms)
        self._logs: dict[tuple[str, int], list[_Record]] = {}
        self._tables: dict[str, _MemoryTable] = {}
        self._dead_letters = self.settings.topic("dead-letters")
        self.wiring = Wiring(settings=self.settings, topic=_TopicRef, table=self._declare_table, dead_letters=_TopicRef(self._dead_letters))
        self.stages: list[Stage] = []
        self.flows = FlowTopology(flows, self.wiring) if flows else None
        if self.flows is not None:
            self.stages += self.flows.stages()
        self.eof_jobs = {name: EofTopology(job, self.wiring, name=name) for name, job in (eof_jobs or {}).items()}
        for topology in self.eof_jobs.values():
            self.stages += topology.stages()
        self.pipeline = PipelineTopology(item_step, self.wiring) if item_step is not None else None
        if self.pipeline is not None:
            self.stages += self.pipeline.stages()
        self.triggers = TriggerTopology(self.wiring, status_source=lambda: status_source) if triggers else None
        if self.triggers is not None:
            self.stages += self.triggers.stages()
        self.windows = WindowTopology(windows, self.wiring) if windows else None
        if self.windows is not None:
            self.stages += self.windows.stages()
        #: a package's own topologies, each built on the driver's wiring (anything with ``stages()``)
        self.topologies = [build(self.wiring) for build in topologies]
        for topology in self.topologies:
            self.stages += topology.stages()
        #: when each ticked stage's next tick and each timer's next run are due
        self._next_tick = {stage.name: start_ms + self._tick_every(stage) for stage in self.stages if stage.ticked}
        self._next_timer = {
            (stage.name, index): start_ms + int(timer.every_s * 1000) for stage in self.stages for index, timer in enumerate(stage.timers)
        }
        self._positions: dict[tuple[str, str, int], int] = {}
        self._committed_positions: dict[tuple[str, str, int], int] = {}
        self._committed_tables: dict[str, dict[str, Any]] = {name: {} for name in self._tables}
        self._environment = environment.Environment(
            clock=self.clock,
            outlet=_Outlet(self, _TopicRef(self._dead_letters)),
            max_message_bytes=self.settings.max_message_bytes,
            record_limit=self.settings.max_message_bytes - 1024,
        )
        self._loop = asyncio.new_event_loop()
        self._crash_after: int | None = None
        #: crashes simulated so far
        self.crashes = 0
        #: events the stages handled so far (those of rounds a crash rolled back too)
        self.events_handled = 0

    # -- the test's side -------------------------------------------------------------------------------------

    def pipe(
        self,
        topic: str,
        value: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        run: bool = True,
    ) -> None:
        """Write one record to ``topic`` (a flow's source, say) and run every stage until nothing is left to do.

        ``value``: JSON-able, or bytes as they are (an undecodable record, say). ``timestamp_ms``: the record's
        timestamp (default: the clock's now, as a producer's CreateTime). ``run=False``: only write it (several
        records piped so are read in one batch by the next :meth:`run`).
        """
        raw = value if isinstance(value, bytes) else dumps(value)
        encoded_headers = [(name, text.encode()) for name, text in (headers or {}).items()]
        encoded_key = key.encode() if key is not None else None
        self._append(self.settings.topic(topic), encoded_key, raw, encoded_headers, partition, committed=True, timestamp_ms=timestamp_ms)
        if run:
            self.run()

    def advance(self, *, seconds: float = 0, ms: int = 0) -> None:
        """Move the clock forward in steps of the shortest tick interval; at each step, the ticks and timers that came due
        (as a worker's timers send them: every ticked topic's partitions, each stage at its own interval), then the
        stages run (deadlines, timeouts, retention, sweeps)."""
        remaining = int(seconds * 1000) + ms
        step = max(1, min([self.settings.tick_interval_ms, *(self._tick_every(stage) for stage in self.stages if stage.ticked)]))
        while remaining > 0:
            moved = min(step, remaining)
            self.clock.advance(moved)
            remaining -= moved
            self._due_ticks_and_timers()
            self.run()

    def tick(self) -> None:
        """Send every ticked stage its tick now, to every partition (whatever their intervals), and run the stages."""
        for stage in self.stages:
            self._tick(stage)
        self.run()

    def _tick_every(self, stage: Stage) -> int:
        return stage.tick_every_ms or self.settings.tick_interval_ms

    def _tick(self, stage: Stage) -> None:
        for topic in {ticked.get_topic_name() for ticked in stage.ticked}:
            for partition in range(self.settings.partitions):
                self._append(topic, None, dumps(stage.tick_value), [], partition, committed=True)

    def _due_ticks_and_timers(self) -> None:
        now = self.clock.now_ms()
        for stage in self.stages:
            if stage.ticked and self._next_tick[stage.name] <= now:
                self._tick(stage)
                while self._next_tick[stage.name] <= now:
                    self._next_tick[stage.name] += self._tick_every(stage)
            for index, timer in enumerate(stage.timers):
                key = (stage.name, index)
                if self._next_timer[key] <= now:
                    with environment.using(self._environment):
                        self._loop.run_until_complete(timer.run())
                    while self._next_timer[key] <= now:
                        self._next_timer[key] += max(1, int(timer.every_s * 1000))

    def eof_client(self, client: str, records: Sequence[Any], *, job: str = "", batch_size: int = 20, side: Any = None) -> Any:
        """One client through end-of-stream job ``job``, as :class:`app.eof_gateway.Gateway` runs it on a broker: its
        batches, its side data, its end; then its report (None if none came), and "delivered" (the cleanup follows)."""
        batches, side_data, end = client_messages(client, records, batch_size=batch_size, side=side)
        for topic, key, value in [*batches, side_data, end]:
            self.pipe(topic_base(job, topic), value, key=key)
        desk = ReportDesk()  # as the gateway reads them: a job answered by its filter sends parts and an end
        taken = [desk.take(record.value) for record in self.read(topic_base(job, TOPIC_REPORTS))]
        reports = [report for found in taken if found is not None for name, report in [found] if name == client]
        if not reports:
            return None
        topic, key, value = delivered_message(client)
        self.pipe(topic_base(job, topic), value, key=key)
        return reports[-1]

    def crash_after(self, events: int) -> None:
        """The next round crashes once ``events`` more events were handled, before it commits (a SIGKILL there):
        its records are aborted, the tables and positions go back to the last commit, and the stages run again."""
        self._crash_after = max(1, events)

    def run(self) -> None:
        """Run rounds until no stage has anything left to read."""
        with environment.using(self._environment):
            self._loop.run_until_complete(self._run_until_idle())

    def read(self, topic: str) -> list[TestRecord]:
        """The committed records of ``topic`` (the flows' name), by partition and offset."""
        return self._read(self.settings.topic(topic))

    def values(self, topic: str) -> list[Any]:
        """The values of :meth:`read`."""
        return [record.value for record in self.read(topic)]

    def dead_letters(self) -> list[dict[str, Any]]:
        """The dead letters (``app.errors.dead_letter_record``): agent, step, reason, error, the original record..."""
        return [record.value for record in self._read(self._dead_letters)]

    def table(self, name: str) -> dict[str, Any]:
        """A copy of table ``name`` (as the worker names it, e.g. ``barrier-<barrier>``, ``flow-<flow>-<aggregate>``)."""
        if name not in self._tables:
            raise KeyError(f"no table {name!r}; the tables are {sorted(self._tables)}")
        return dict(self._tables[name])

    def tables(self) -> list[str]:
        """The names of the tables the flows keep."""
        return sorted(self._tables)

    def close(self) -> None:
        self._loop.close()

    def __enter__(self) -> TestDriver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the worker's side -----------------------------------------------------------------------------------

    def _declare_table(self, name: str, help_text: str) -> _MemoryTable:
        table = _MemoryTable(name, help_text)
        self._tables[name] = table
        return table

    def _append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]],
        partition: int | None,
        *,
        committed: bool,
        timestamp_ms: int | None = None,
    ) -> None:
        if partition is None:
            partition = key_partition(key, self.settings.partitions) if key is not None else 0
        stamp = self.clock.now if timestamp_ms is None else timestamp_ms
        self._logs.setdefault((topic, partition), []).append(_Record(key, value, headers, committed=committed, timestamp_ms=stamp))

    def _read(self, topic: str) -> list[TestRecord]:
        found = []
        for partition in range(self.settings.partitions):
            for offset, record in enumerate(self._logs.get((topic, partition), [])):
                if record.committed:
                    found.append(_test_record(topic, partition, offset, record, self.settings.topic_prefix))
        return found

    def _pending(self, stage: Stage, topic: str, partition: int) -> list[_Event]:
        """The events ``stage`` has yet to read on a partition: committed records past its position, up to the first
        record of an open transaction (a read_committed consumer stops there)."""
        log = self._logs.get((topic, partition), [])
        position = self._positions.get((stage.name, topic, partition), 0)
        events = []
        for offset in range(position, len(log)):
            record = log[offset]
            if record.aborted:
                continue
            if not record.committed:
                break
            message = _Message(topic, partition, offset, record.key, record.value, record.headers, record.timestamp_ms / 1000)
            events.append(_Event(message))
        return events

    async def _run_until_idle(self) -> None:
        while True:
            try:
                handled = await self._round()
            except Crashed:
                self._roll_back()
                continue
            self._commit()
            if not handled:
                return

    async def _round(self) -> int:
        """Each stage handles what it can read, one part per source partition; returns how many events were handled."""
        handled = 0
        for stage in self.stages:
            for topic in (source.get_topic_name() for source in stage.sources):
                for partition in range(self.settings.partitions):
                    events = self._pending(stage, topic, partition)
                    if not events:
                        continue
                    # a worker's slice of a stage that runs user steps may stop after any event (app.core.run_sliced):
                    # one event a part here, so that a crash may come after each
                    parts = [[event] for event in events] if stage.runs_user_steps else [events]
                    for part in parts:
                        await stage.handle_part(cast(list[EventT[bytes]], part))
                        last = part[-1].message.offset
                        self._positions[(stage.name, topic, partition)] = last + 1
                        handled += len(part)
                        self.events_handled += len(part)
                        if self._crash_after is not None:
                            self._crash_after -= len(part)
                            if self._crash_after <= 0:
                                self._crash_after = None
                                raise Crashed
        return handled

    def _commit(self) -> None:
        for log in self._logs.values():
            for record in log:
                if not record.aborted:
                    record.committed = True
        self._committed_positions = dict(self._positions)
        self._committed_tables = {name: dict(table) for name, table in self._tables.items()}

    def _roll_back(self) -> None:
        self.crashes += 1
        for log in self._logs.values():
            for record in log:
                if not record.committed:
                    record.aborted = True
        self._positions = dict(self._committed_positions)
        for name, table in self._tables.items():
            table.clear()
            table.update(self._committed_tables.get(name, {}))


def _test_record(topic: str, partition: int, offset: int, record: _Record, prefix: str) -> TestRecord:
    try:
        value: Any = loads(record.value, what=f"{topic}@{partition}:{offset}", max_bytes=len(record.value))
    except Exception:  # a record that is not JSON (a test piped raw bytes): handed back as it is
        value = record.value
    name = topic[len(prefix) :] if topic.startswith(prefix) else topic
    return TestRecord(
        topic=name,
        partition=partition,
        offset=offset,
        key=record.key.decode("utf-8", "replace") if record.key is not None else None,
        value=value,
        headers={header: raw.decode("utf-8", "replace") for header, raw in record.headers},
    )
