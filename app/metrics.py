"""Every worker's Prometheus metrics: one registry, the metrics the shared layers count, and what is read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from weir.app import engine
from weir.app.runtime.views import best_match
from weir.tables.barrier import BarrierState
from weir.tables.eof import ControllerState
from weir.tables.triggers import TriggerState
from weir.tables.windows import open_windows_of

__all__ = [
    "REGISTRY",
    "CONTENT_TYPE",
    "EVENTS_HANDLED",
    "RECORDS_HANDLED",
    "BATCH_EVENTS",
    "DEAD_LETTERS",
    "OUTPUTS_SENT",
    "OUTPUTS_UNDELIVERABLE",
    "INPUTS_REJECTED",
    "COMMIT_DURATION",
    "COMMITS",
    "REBALANCES",
    "AGGREGATE_COMPLETIONS",
    "AGGREGATE_DUPLICATES",
    "AGGREGATE_LATE_PARTS",
    "aggregate_completed",
    "aggregate_parts",
    "RESTORE_DURATION",
    "TRANSACTION_ABORTS",
    "BARRIER_RELEASES",
    "BARRIER_FAILURES",
    "restore_observed",
    "transaction_aborted",
    "barrier_settled",
    "TableGauge",
    "register_table_gauge",
    "table_gauge_for",
    "ScrapedCounter",
    "TRIGGER_FIRES",
    "OutboxCollector",
    "OUTBOX_COLLECTOR",
    "watch_outbox_relay",
    "serve",
    "WorkerState",
    "WorkerCollector",
    "COLLECTOR",
    "count_rebalance",
    "events_handled",
    "outputs_sent",
    "batch_handled",
    "dead_lettered",
    "commit_observed",
    "lag_by_partition",
    "install",
    "exposition",
]

# Names follow Prometheus' conventions: ``weir_`` first, counters end in ``_total``, durations are in seconds.
# Labels are bounded: agents, topics, partitions, reasons, tables; never a key or a correlation id.

#: weir's own registry (not prometheus_client's global one): what /metrics shows is exactly what is defined here.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: The Content-Type of :func:`exposition`'s body (Prometheus' text format).
CONTENT_TYPE = CONTENT_TYPE_LATEST

EVENTS_HANDLED = Counter(
    "weir_events_handled_total",
    "Input events an agent handled through the shared event loop (dead-lettered ones included).",
    ["agent"],
    registry=REGISTRY,
)
RECORDS_HANDLED = Counter(
    "weir_records_handled_total",
    "Records taken in batches and handled, per source partition (skipped ones of an older consumer generation excluded).",
    ["topic", "partition"],
    registry=REGISTRY,
)
#: Batches run between two commits: one event up to WEIR_BATCH_SIZE (500 by default).
BATCH_EVENTS = Histogram(
    "weir_batch_events",
    "Events per handled batch (one slice of a batch, all source partitions together).",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "weir_dead_letters_total",
    "Records sent to the dead-letter topic, by the agent that sent them and the reason.",
    ["agent", "reason"],
    registry=REGISTRY,
)
OUTPUTS_SENT = Counter(
    "weir_outputs_sent_total",
    "Outputs of the keyed-state runtime sent (queued in the transaction under exactly_once), by agent.",
    ["agent"],
    registry=REGISTRY,
)
OUTPUTS_UNDELIVERABLE = Counter(
    "weir_outputs_undeliverable_total",
    "Outputs that could not be written (too large for a record, not serialisable) and were dead-lettered instead, by agent.",
    ["agent"],
    registry=REGISTRY,
)
INPUTS_REJECTED = Counter(
    "weir_inputs_rejected_total",
    "Inputs a pattern refused (each one also a dead letter), by agent and reason.",
    ["agent", "reason"],
    registry=REGISTRY,
)
COMMIT_DURATION = Histogram(
    "weir_commit_duration_seconds",
    "Exactly-once commits: flushing, awaiting the deliveries they cover, committing the transactions and beginning the next.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
COMMITS = Counter(
    "weir_commits_total",
    "Exactly-once commits by outcome: committed; failed (a write or send it covers was not delivered, or it raised: "
    "its transaction is never committed, its inputs are read again); fenced (another worker owns the partitions).",
    ["outcome"],
    registry=REGISTRY,
)
REBALANCES = Counter(
    "weir_rebalances_total",
    "Partition assignments this worker received (one per rebalance of its consumer group).",
    registry=REGISTRY,
)


AGGREGATE_COMPLETIONS = Counter(
    "weir_aggregate_completions_total",
    "Groups an aggregator completed, by status (complete, partial, discarded) and reason (count, flag, size, predicate, "
    "timeout, inactivity, forced, too-large).",
    ["aggregator", "status", "reason"],
    registry=REGISTRY,
)
AGGREGATE_DUPLICATES = Counter(
    "weir_aggregate_duplicates_total",
    "Parts an aggregator dropped because their index (or read position) was merged already.",
    ["aggregator"],
    registry=REGISTRY,
)
AGGREGATE_LATE_PARTS = Counter(
    "weir_aggregate_late_parts_total",
    "Parts that arrived for a completed group (counted, never merged); they outlive the group's done mark here.",
    ["aggregator"],
    registry=REGISTRY,
)


RESTORE_DURATION = Histogram(
    "weir_restore_duration_seconds",
    "Restores of this worker's tables: from the recovery that follows a partition assignment until every table is up to "
    "date with its changelog (a restore with nothing to read included).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
    registry=REGISTRY,
)
TRANSACTION_ABORTS = Counter(
    "weir_transaction_aborts_total",
    "Exactly-once commits that ended their transaction without committing it, per source partition whose handled records "
    "it held, by outcome (failed, fenced): the broker aborts the transaction and the records are handled again from the "
    "committed offset. Except after a rebalance, such a commit also stops the worker.",
    ["topic", "partition", "outcome"],
    registry=REGISTRY,
)
BARRIER_RELEASES = Counter(
    "weir_barrier_releases_total",
    "Exchanges a barrier released (every flow it awaited completed for their keys): each resumes its flow once.",
    ["barrier"],
    registry=REGISTRY,
)
BARRIER_FAILURES = Counter(
    "weir_barrier_failures_total",
    "Exchanges a barrier failed (each dead-lettered, its execution ended failed), by reason (timeout, awaited-failed, "
    "duplicate-waiter, superseded).",
    ["barrier", "reason"],
    registry=REGISTRY,
)


def restore_observed(seconds: float) -> None:
    """The engine's restore observer (:func:`app.engine.observe_restores`)."""
    RESTORE_DURATION.observe(seconds)


def transaction_aborted(outcome: str, partitions: Iterable[Any]) -> None:
    """The engine's abort observer (:func:`app.engine.observe_aborts`): ``partitions`` are source partitions (TPs)."""
    for tp in partitions:
        _child(TRANSACTION_ABORTS, tp.topic, str(tp.partition), outcome).inc()


#: Each labelled child a counter was asked for: prometheus_client's ``labels()`` takes a lock and builds its key on every
#: call (3% of an inline splitter's busy samples when it was called once per event; 3% of the aggregator's once per result)
_CHILDREN: dict[tuple[Any, tuple[str, ...]], Any] = {}


def _child(metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label set."""
    child = _CHILDREN.get((metric, labels))
    if child is None:
        child = _CHILDREN[(metric, labels)] = metric.labels(*labels)
    return child


def barrier_settled(barrier: str, *, released: int = 0, failed: Iterable[str] = ()) -> None:
    """A barrier's transition: ``released`` exchanges resume their flow, one failure per reason in ``failed``."""
    if released:
        _child(BARRIER_RELEASES, barrier).inc(released)
    for reason in failed:
        _child(BARRIER_FAILURES, barrier, reason).inc()


def aggregate_completed(aggregator: str, status: str, reason: str) -> None:
    _child(AGGREGATE_COMPLETIONS, aggregator, status, reason).inc()


def aggregate_parts(aggregator: str, *, duplicates: int = 0, late: int = 0) -> None:
    if duplicates:
        _child(AGGREGATE_DUPLICATES, aggregator).inc(duplicates)
    if late:
        _child(AGGREGATE_LATE_PARTS, aggregator).inc(late)


def events_handled(agent: str, count: int = 1) -> None:
    _child(EVENTS_HANDLED, agent).inc(count)


def outputs_sent(agent: str, count: int) -> None:
    """``count`` more outputs of ``agent`` sent (weir_outputs_sent_total)."""
    _child(OUTPUTS_SENT, agent).inc(count)


def outputs_undeliverable(agent: str, count: int) -> None:
    """``count`` outputs of ``agent`` could not be written and went to the dead letters (weir_outputs_undeliverable_total)."""
    _child(OUTPUTS_UNDELIVERABLE, agent).inc(count)


def input_rejected(agent: str, reason: str) -> None:
    _child(INPUTS_REJECTED, agent, reason).inc()


def batch_handled(parts: Mapping[Any, Sequence[Any]]) -> None:
    """A batch ran (:func:`app.core.run_parts`): its events by source partition (a TP)."""
    ran = 0
    for tp, part in parts.items():
        _child(RECORDS_HANDLED, tp.topic, str(tp.partition)).inc(len(part))
        ran += len(part)
    if ran:
        BATCH_EVENTS.observe(ran)


def dead_lettered(agent: str, reason: str) -> None:
    _child(DEAD_LETTERS, agent, reason).inc()


def commit_observed(seconds: float, outcome: str) -> None:
    """The engine's commit observer (:func:`app.engine.observe_commits`)."""
    COMMIT_DURATION.observe(seconds)
    _child(COMMITS, outcome).inc()


def lag_by_partition(highwaters: Mapping[Any, int | None], committed: Mapping[Any, int]) -> dict[Any, int]:
    """Records between each partition's committed offset and its end (the last stable offset under exactly_once).

    ``highwaters`` names the partitions; one without a committed offset counts from offset 0 (the group reads from
    the earliest). Partitions whose end is not known yet (nothing fetched) are left out rather than shown as 0. On a
    topic written in transactions the commit marker after the last record counts as one, as in Kafka's own tools:
    the committed offset stops before it.
    """
    lag = {}
    for tp, end in highwaters.items():
        if end is not None and end >= 0:
            lag[tp] = max(0, end - committed.get(tp, 0))
    return lag


@dataclass(frozen=True)
class TableGauge:
    """A gauge read at scrape time from the values of a pattern's table: ``count(value)`` summed over the keys this worker
    holds in each partition it owns, labelled by partition (and by ``label``, the part of the table's name that the
    ``*`` of its pattern matched: a barrier's name)."""

    name: str
    help: str
    count: Callable[[Any], int]
    label: str | None = None

    def family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self.name, self.help, labels=[*([self.label] if self.label else []), "partition"])


#: Table name or ``*`` pattern -> its gauge (None: none, for a name that a shorter pattern would match).
_table_gauges: dict[str, TableGauge | None] = {}


def register_table_gauge(tables: str, gauge: TableGauge | None) -> None:
    """Read ``gauge`` from the tables named ``tables`` (a name, or a pattern with one ``*``, matched as the views are)."""
    if gauge is not None and gauge.label is not None and tables.count("*") != 1:
        message = f"table gauge {gauge.name}: label {gauge.label!r} is what the '*' of a pattern matches; {tables!r} has no single '*'"
        raise ValueError(message)
    _table_gauges[tables] = gauge


def table_gauge_for(table: str) -> tuple[TableGauge, tuple[str, ...]] | None:
    """The gauge of ``table`` and its labels but the partition (what the pattern's ``*`` matched), or None."""
    gauge = best_match(table, _table_gauges)
    if gauge is None:
        return None
    if gauge.label is None:
        return gauge, ()
    pattern = next(pattern for pattern, registered in _table_gauges.items() if registered is gauge and "*" in pattern)
    before, _, after = pattern.partition("*")
    return gauge, (table[len(before) : len(table) - len(after)],)


def _waiting_exchanges(value: Any) -> int:
    return len(BarrierState.from_dict(value).waiting)


def _pending_parent(value: Any) -> int:
    return 1 if TriggerState.from_dict(value).registered else 0


def _open_windows(value: Any) -> int:
    return len(open_windows_of(value))


def _stream_time_s(value: Any) -> int:
    return int(value) // 1000


def _client_in_flight(value: Any) -> int:
    return 1 if ControllerState.from_dict(value).closed_ms is None else 0


register_table_gauge(
    "barrier-*",
    TableGauge(
        "weir_barrier_waiting_exchanges",
        "Exchanges waiting at a barrier, in the partitions of its table this worker owns (each one row, no task).",
        _waiting_exchanges,
        label="barrier",
    ),
)
register_table_gauge("barrier-*-deadlines", None)
register_table_gauge(
    "window-*",
    TableGauge(
        "weir_window_open", "Event-time windows open (not closed yet), in the partitions this worker owns.", _open_windows, label="window"
    ),
)
register_table_gauge(
    "window-*-time",
    TableGauge(
        "weir_window_stream_time_seconds",
        "A window's stream time per partition: the largest record timestamp it read (whole seconds since the epoch).",
        _stream_time_s,
        label="window",
    ),
)
register_table_gauge("window-*-closes", None)
register_table_gauge(
    "triggers",
    TableGauge(
        "weir_trigger_parents_pending",
        "Counter-trigger parents registered and not fired yet (waiting for children), in the partitions this worker owns.",
        _pending_parent,
    ),
)
register_table_gauge(
    "eof_counters",
    TableGauge(
        "weir_eof_clients_in_flight",
        "EOF clients the controller counts and has not cleaned up yet (tombstones of finished clients left out), in the "
        "partitions this worker owns.",
        _client_in_flight,
    ),
)


class ScrapedCounter:
    """A counter a pattern's shell keeps itself (a dict of counts by label value), read at scrape time."""

    def __init__(self, name: str, help_text: str, label: str) -> None:
        self.name = name
        self.help = help_text
        self.label = label
        #: set where the shell is loaded (its process runs that pattern); None elsewhere: no samples
        self.read: Callable[[], Mapping[str, int]] | None = None

    def family(self, *, with_values: bool) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name.removesuffix("_total"), self.help, labels=[self.label])
        if with_values and self.read is not None:
            for value, count in sorted(self.read().items()):
                family.add_metric([value], count)
        return family


TRIGGER_FIRES = ScrapedCounter(
    "weir_trigger_fires_total",
    "Counter triggers fired, by what fired them: count (the last child's completion), registration (its children had all "
    "completed before the parent registered), sweep (the safety sweep found every child done: completion events were lost).",
    "fired_by",
)


class WorkerState:
    """What the scrape reads from the running worker (the Faust app); a stand-in in unit tests."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def committed_offsets(self) -> Mapping[Any, int]:
        return engine.committed_offsets(self.app)

    def source_partitions(self) -> set[Any]:
        """The partitions assigned to this worker of the topics its agents read (no changelog, no Faust-internal topic)."""
        try:
            assigned = self.app.consumer.assignment()
        except Exception:  # the consumer is not started yet (or stopping)
            return set()
        read = {name for agent in self.app.agents.values() for name in getattr(agent.channel, "topics", ())}
        return {tp for tp in assigned if tp.topic in read}

    def highwater(self, tp: Any) -> int | None:
        try:
            found = self.app.consumer.highwater(tp)
        except Exception:  # the consumer is not started yet (or stopping): no end known
            return None
        return None if found is None else int(found)

    def table_partitions(self) -> Iterator[tuple[str, int, Iterator[Any]]]:
        """(table, partition, the values this worker holds there) for every RocksDB table, over the partitions it owns."""
        actives = list(self.app.assignor.assigned_actives())
        for name, table in sorted(self.app.tables.items()):
            if not engine.by_partition(table):
                continue
            changelog = table.changelog_topic.get_topic_name()
            for partition in sorted(tp.partition for tp in actives if tp.topic == changelog):
                yield name, partition, (value for _, value in engine.partition_items(table, partition))


class WorkerCollector(Collector):
    """What is read at scrape time: consumer lag per source partition, keys held per table and partition, the patterns'
    table gauges (:func:`register_table_gauge`) and the counters their shells keep (:class:`ScrapedCounter`).

    Counting keys reads the worker's own partitions of every RocksDB table, as the /weir/ index does: cheap for
    the open groups and waiting exchanges a worker holds, a scan of them all at each scrape (one scan per table
    partition for its keys and its gauge together).
    """

    def __init__(self, state: WorkerState | None = None) -> None:
        #: None until :func:`install` names the worker (a process that runs no worker shows no gauges)
        self.state = state

    def describe(self) -> Iterable[Metric]:
        return self.families(with_values=False)

    def collect(self) -> Iterable[Metric]:
        return self.families(with_values=True)

    def families(self, *, with_values: bool) -> list[Metric]:
        lag = GaugeMetricFamily(
            "weir_consumer_lag_records",
            "Records of a source partition after its committed offset (to its end: the last stable offset under exactly_once).",
            labels=["topic", "partition"],
        )
        keys = GaugeMetricFamily(
            "weir_table_keys",
            "Keys of a table this worker holds in a partition it owns (table aggregates: the open groups).",
            labels=["table", "partition"],
        )
        gauges = {gauge.name: gauge.family() for gauge in _table_gauges.values() if gauge is not None}
        if with_values and self.state is not None:
            committed = self.state.committed_offsets()
            highwaters = {tp: self.state.highwater(tp) for tp in self.state.source_partitions()}
            for tp, records in sorted(lag_by_partition(highwaters, committed).items()):
                lag.add_metric([tp.topic, str(tp.partition)], records)
            for table, partition, values in self.state.table_partitions():
                found = table_gauge_for(table)
                count = total = 0
                for value in values:
                    count += 1
                    if found is not None:
                        total += _counted(found[0], table, value)
                keys.add_metric([table, str(partition)], count)
                if found is not None:
                    gauges[found[0].name].add_metric([*found[1], str(partition)], total)
        return [lag, keys, *gauges.values(), TRIGGER_FIRES.family(with_values=with_values)]


def _counted(gauge: TableGauge, table: str, value: Any) -> int:
    """What one value adds to its table's gauge; a value the gauge cannot read adds nothing (the web view shows why)."""
    try:
        return int(gauge.count(value))
    except Exception:
        return 0


COLLECTOR = WorkerCollector()
REGISTRY.register(COLLECTOR)


class OutboxCollector(Collector):
    """An outbox relay's figures, read at scrape time: its counters (:class:`app.outbox.RelayStats`) and, from the
    outbox's database, the rows waiting and how long the oldest of them has waited (the relay's lag).

    Served by the relay's own process (``python -m app.outbox_relay --metrics-port``), which runs no Faust worker.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        #: the relays of this process (:func:`watch_outbox_relay`)
        self.relays: list[Any] = []
        self.clock = clock

    def describe(self) -> Iterable[Metric]:
        return self.families(with_values=False)

    def collect(self) -> Iterable[Metric]:
        return self.families(with_values=True)

    def families(self, *, with_values: bool) -> list[Metric]:
        pending = GaugeMetricFamily("weir_outbox_rows_pending", "Outbox rows written and not yet published.", labels=["outbox"])
        lag = GaugeMetricFamily(
            "weir_outbox_relay_lag_seconds",
            "How long the oldest outbox row not yet published has waited since it was written (0: none waits).",
            labels=["outbox"],
        )
        relayed = CounterMetricFamily(
            "weir_outbox_rows_relayed", "Outbox rows the relay published (committed on the broker) since it started.", labels=["outbox"]
        )
        rounds = CounterMetricFamily("weir_outbox_relay_rounds", "Relay rounds committed: one Kafka transaction each.", labels=["outbox"])
        failures = CounterMetricFamily(
            "weir_outbox_publish_failures",
            "Relay rounds that failed (their Kafka transaction aborted; the round was settled and published again).",
            labels=["outbox"],
        )
        wakes = CounterMetricFamily(
            "weir_outbox_relay_wakes",
            "Times the sleeping relay woke, by cause: signal (the stream trigger: a writer's commit) or safety (its safety timer).",
            labels=["outbox", "cause"],
        )
        if with_values:
            now_ms = int(self.clock() * 1000)
            for relay in self.relays:
                source = str(relay.outbox.source)
                stats = relay.stats
                relayed.add_metric([source], stats.rows_published)
                rounds.add_metric([source], stats.rounds)
                failures.add_metric([source], stats.publish_failures)
                wakes.add_metric([source, "signal"], stats.signal_wakes)
                wakes.add_metric([source, "safety"], stats.safety_wakes)
                try:  # the scrape's own connection (per thread); a database that does not answer leaves the gauges out
                    waiting = relay.outbox.pending_count()
                    oldest = relay.outbox.oldest_pending_ms()
                except Exception:
                    continue
                pending.add_metric([source], waiting)
                lag.add_metric([source], 0.0 if oldest is None else max(0, now_ms - oldest) / 1000)
        return [pending, lag, relayed, rounds, failures, wakes]


OUTBOX_COLLECTOR = OutboxCollector()
REGISTRY.register(OUTBOX_COLLECTOR)


def watch_outbox_relay(relay: Any) -> None:
    """Show ``relay`` (an :class:`app.outbox.OutboxRelay`) in this process's metrics. Idempotent."""
    if relay not in OUTBOX_COLLECTOR.relays:
        OUTBOX_COLLECTOR.relays.append(relay)


def serve(host: str, port: int) -> None:
    """Serve :data:`REGISTRY` at ``http://host:port/metrics`` from a thread (a process that runs no Faust web server)."""
    start_http_server(port, addr=host, registry=REGISTRY)


async def count_rebalance(sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
    """Receiver of Faust's ``on_partitions_assigned`` signal: every rebalance ends with one."""
    REBALANCES.inc()


def install(app: Any) -> None:
    """Wire the worker's metrics: the engine's commit, abort and restore observers, the rebalance count, the scrape-time
    gauges. Idempotent."""
    engine.observe_commits(commit_observed)
    engine.observe_aborts(transaction_aborted)
    engine.observe_restores(restore_observed)
    app.on_partitions_assigned.connect(count_rebalance)  # a set of receivers: connecting twice is once
    COLLECTOR.state = WorkerState(app)


def exposition() -> bytes:
    """Every metric of :data:`REGISTRY` in Prometheus' text format."""
    return generate_latest(REGISTRY)
