"""Every worker's Prometheus metrics: one registry, the metrics the shared layers count, and what is read at scrape time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app import engine

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
    "WorkerState",
    "WorkerCollector",
    "COLLECTOR",
    "count_rebalance",
    "events_handled",
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


def aggregate_completed(aggregator: str, status: str, reason: str) -> None:
    AGGREGATE_COMPLETIONS.labels(aggregator, status, reason).inc()


def aggregate_parts(aggregator: str, *, duplicates: int = 0, late: int = 0) -> None:
    if duplicates:
        AGGREGATE_DUPLICATES.labels(aggregator).inc(duplicates)
    if late:
        AGGREGATE_LATE_PARTS.labels(aggregator).inc(late)


def events_handled(agent: str, count: int = 1) -> None:
    EVENTS_HANDLED.labels(agent).inc(count)


def batch_handled(parts: Mapping[Any, Sequence[Any]]) -> None:
    """A batch ran (:func:`app.core.run_parts`): its events by source partition (a TP)."""
    ran = 0
    for tp, part in parts.items():
        RECORDS_HANDLED.labels(tp.topic, str(tp.partition)).inc(len(part))
        ran += len(part)
    if ran:
        BATCH_EVENTS.observe(ran)


def dead_lettered(agent: str, reason: str) -> None:
    DEAD_LETTERS.labels(agent, reason).inc()


def commit_observed(seconds: float, outcome: str) -> None:
    """The engine's commit observer (:func:`app.engine.observe_commits`)."""
    COMMIT_DURATION.observe(seconds)
    COMMITS.labels(outcome).inc()


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

    def table_keys(self) -> Iterator[tuple[str, int, int]]:
        """(table, partition, keys this worker holds there) for every RocksDB table, over the partitions it owns."""
        actives = list(self.app.assignor.assigned_actives())
        for name, table in sorted(self.app.tables.items()):
            if not engine.by_partition(table):
                continue
            changelog = table.changelog_topic.get_topic_name()
            for partition in sorted(tp.partition for tp in actives if tp.topic == changelog):
                yield name, partition, sum(1 for _ in engine.partition_items(table, partition))


class WorkerCollector(Collector):
    """The gauges read at scrape time: consumer lag per source partition and keys held per table and partition.

    Counting keys reads the worker's own partitions of every RocksDB table, as the /weir/ index does: cheap for
    the open groups and waiting exchanges a worker holds, a scan of them all at each scrape.
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
        if with_values and self.state is not None:
            committed = self.state.committed_offsets()
            highwaters = {tp: self.state.highwater(tp) for tp in self.state.source_partitions()}
            for tp, records in sorted(lag_by_partition(highwaters, committed).items()):
                lag.add_metric([tp.topic, str(tp.partition)], records)
            for table, partition, count in self.state.table_keys():
                keys.add_metric([table, str(partition)], count)
        return [lag, keys]


COLLECTOR = WorkerCollector()
REGISTRY.register(COLLECTOR)


async def count_rebalance(sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
    """Receiver of Faust's ``on_partitions_assigned`` signal: every rebalance ends with one."""
    REBALANCES.inc()


def install(app: Any) -> None:
    """Wire the worker's metrics: the engine's commit observer, the rebalance count, the scrape-time gauges. Idempotent."""
    engine.observe_commits(commit_observed)
    app.on_partitions_assigned.connect(count_rebalance)  # a set of receivers: connecting twice is once
    COLLECTOR.state = WorkerState(app)


def exposition() -> bytes:
    """Every metric of :data:`REGISTRY` in Prometheus' text format."""
    return generate_latest(REGISTRY)
