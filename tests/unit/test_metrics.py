"""app.metrics without Kafka: what the shared layers count, what the scrape reads, and names by Prometheus' conventions."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP
from prometheus_client.parser import text_string_to_metric_families

from weir.app import core, engine, metrics
from weir.app.engine import commit, delivery, restore
from weir.app.outbox import RelayStats, SQLiteOutbox, write
from weir.app.runtime import environment, keyed
from weir.app.runtime.keyed import Change, KeyedState, Output, Refusal
from weir.tables.barrier import BarrierState, Waiting
from weir.tables.eof import ControllerState
from weir.tables.triggers import TriggerState

#: The only label names a weir metric may have: all bounded (never a key or a correlation id).
BOUNDED_LABELS = {
    "agent",
    "topic",
    "partition",
    "reason",
    "table",
    "outcome",
    "aggregator",
    "status",
    "barrier",
    "fired_by",
    "outbox",
    "cause",
}


def value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def scraped() -> dict[str, Any]:
    """The exposition parsed by the Prometheus client's own parser: family name -> family."""
    return {family.name: family for family in text_string_to_metric_families(metrics.exposition().decode())}


class _Event:
    """Just enough of a Faust event for run_parts (as in tests/unit/eos/test_run_parts.py)."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.message = SimpleNamespace(tp=TP(topic, partition), offset=offset, generation_id=1, partition=partition, topic=topic)
        self.message.key, self.message.headers, self.message.value = b"k", None, b"{}"
        self.app = SimpleNamespace(consumer_generation_id=1, consumer=SimpleNamespace(_committed_offset={}))

    def ack(self) -> bool:
        return True


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes | None, bytes]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.sent.append((key, value))


class _DictStore:
    def __init__(self) -> None:
        self.states: dict[str, Any] = {}

    def load(self, key: str) -> Any:
        return self.states.get(key)

    def save(self, key: str, previous: Any, state: Any) -> None:
        self.states[key] = state

    def encoded_size(self, key: str, state: Any) -> int:
        return 10


@pytest.fixture
def dead_letter_topic() -> Iterator[_Topic]:
    """Dead letters go to this topic's own ``send`` (the environment's outlet, as a worker's goes to its engine)."""
    topic = _Topic("dead-letters")
    environment.install(environment.Environment(clock=environment.WallClock(), outlet=environment.TopicOutlet(topic)))
    yield topic
    environment.install(environment.STANDALONE)


def test_a_batch_counts_its_records_per_source_partition_and_its_size() -> None:
    delivery._processed.clear()
    topic = "metrics-batch"
    events = [_Event(topic, 0, 1), _Event(topic, 1, 1), _Event(topic, 0, 2)]
    before = {partition: value("weir_records_handled_total", topic=topic, partition=partition) for partition in ("0", "1")}
    batches = value("weir_batch_events_count")
    three_or_less = value("weir_batch_events_bucket", le="5.0") - value("weir_batch_events_bucket", le="2.0")

    async def handle_part(part: Any) -> None:
        pass

    asyncio.run(core.run_parts(events, handle_part))
    assert value("weir_records_handled_total", topic=topic, partition="0") - before["0"] == 2
    assert value("weir_records_handled_total", topic=topic, partition="1") - before["1"] == 1
    assert value("weir_batch_events_count") - batches == 1
    assert value("weir_batch_events_bucket", le="5.0") - value("weir_batch_events_bucket", le="2.0") - three_or_less == 1


def test_handled_events_are_counted_per_agent_dead_lettered_or_not(dead_letter_topic: _Topic) -> None:
    agent = "metrics-agent"
    events = [_Event("in", 0, offset) for offset in range(3)]
    handled = value("weir_events_handled_total", agent=agent)
    invalid = value("weir_dead_letters_total", agent=agent, reason="undecodable")

    async def handler(event: Any, raw: Any) -> None:
        pass

    events[1].message.value = b"not json"
    asyncio.run(core.handle_part_events(events, agent=agent, what="metrics: message", handler=handler))
    assert value("weir_events_handled_total", agent=agent) - handled == 3
    assert value("weir_dead_letters_total", agent=agent, reason="undecodable") - invalid == 1
    assert len(dead_letter_topic.sent) == 1


def test_a_dead_letter_record_is_counted_by_its_agent_and_reason(dead_letter_topic: _Topic) -> None:
    before = value("weir_dead_letters_total", agent="metrics-outbox", reason="undeliverable")
    record = {"agent": "metrics-outbox", "step": "send", "reason": "undeliverable", "error": "too large", "key": {"text": "k"}}
    asyncio.run(core.send_dead_letter_record(record))
    assert value("weir_dead_letters_total", agent="metrics-outbox", reason="undeliverable") - before == 1


def test_keyed_state_counts_outputs_sent_undeliverable_and_inputs_rejected(
    monkeypatch: pytest.MonkeyPatch, dead_letter_topic: _Topic
) -> None:
    monkeypatch.setattr(keyed, "record_limit", lambda: 1_000)
    agent = "metrics-keyed"
    out = _Topic("out")
    state = KeyedState(agent=agent, store=_DictStore())
    sent = value("weir_outputs_sent_total", agent=agent)
    undeliverable = value("weir_outputs_undeliverable_total", agent=agent)
    rejected = value("weir_inputs_rejected_total", agent=agent, reason="rejected")
    duplicate = value("weir_inputs_rejected_total", agent=agent, reason="duplicate-order")
    change: Change[Any] = Change(
        state={"n": 1},
        outputs=(Output(out, "a", {"n": 1}), Output(out, "b", {"n": 2}), Output(out, "c", {"blob": "x" * 2_000})),  # type: ignore[arg-type]
        rejected=("too late", Refusal("duplicate-order", "seen before")),
    )
    asyncio.run(state.apply(_Event("in", 0, 1), "k", None, change))  # type: ignore[arg-type]
    assert len(out.sent) == 2
    assert value("weir_outputs_sent_total", agent=agent) - sent == 2
    assert value("weir_outputs_undeliverable_total", agent=agent) - undeliverable == 1
    assert value("weir_inputs_rejected_total", agent=agent, reason="rejected") - rejected == 1
    assert value("weir_inputs_rejected_total", agent=agent, reason="duplicate-order") - duplicate == 1


def test_send_checked_counts_what_it_sent(monkeypatch: pytest.MonkeyPatch, dead_letter_topic: _Topic) -> None:
    monkeypatch.setattr(keyed, "record_limit", lambda: 1_000)
    out = _Topic("out")
    before = value("weir_outputs_sent_total", agent="metrics-stateless")
    outputs = [Output(out, "a", {"n": 1}), Output(out, "b", {"n": 2})]  # type: ignore[arg-type]
    asyncio.run(keyed.send_checked(_Event("in", 0, 1), outputs, agent="metrics-stateless", step="send"))  # type: ignore[arg-type]
    assert value("weir_outputs_sent_total", agent="metrics-stateless") - before == 2


def test_the_lag_is_the_end_less_the_committed_offset_where_both_are_known() -> None:
    a, b, c, d, e = (TP("orders", partition) for partition in range(5))
    lag = metrics.lag_by_partition({a: 10, b: 5, c: None, d: -1, e: 4}, {a: 4, b: 5, c: 3, d: 0})
    assert lag == {a: 6, b: 0, e: 4}, "an end not fetched yet (None, -1) is no lag of 0; nothing committed counts from 0"
    assert metrics.lag_by_partition({a: 3}, {a: 5}) == {a: 0}, "a stale end never makes the lag negative"
    assert metrics.lag_by_partition({}, {a: 5}) == {}, "only the partitions named (a revoked one is not)"


class _State:
    """Stands in for the running worker that :class:`app.metrics.WorkerState` reads."""

    def __init__(self, committed: Mapping[TP, int], ends: Mapping[TP, int | None], values: list[tuple[str, int, list[Any]]]) -> None:
        self.committed, self.ends, self.values = committed, ends, values

    def committed_offsets(self) -> Mapping[TP, int]:
        return self.committed

    def highwater(self, tp: TP) -> int | None:
        return self.ends.get(tp)

    def source_partitions(self) -> set[TP]:
        return set(self.committed) | set(self.ends)

    def table_partitions(self) -> Iterator[tuple[str, int, Iterator[Any]]]:
        return ((table, partition, iter(values)) for table, partition, values in self.values)


@pytest.fixture
def worker_state(monkeypatch: pytest.MonkeyPatch) -> _State:
    state = _State(
        committed={TP("t.orders", 0): 7, TP("t.orders", 1): 2, TP("t.items", 0): 0},
        ends={TP("t.orders", 0): 9, TP("t.orders", 1): 2},
        values=[("aggregates", 0, [{}, {}, {}]), ("aggregates", 2, [])],
    )
    monkeypatch.setattr(metrics.COLLECTOR, "state", state)
    return state


def test_the_scrape_reads_lag_and_table_keys_and_parses(worker_state: _State) -> None:
    families = scraped()
    lag = {(sample.labels["topic"], sample.labels["partition"]): sample.value for sample in families["weir_consumer_lag_records"].samples}
    assert lag == {("t.orders", "0"): 2, ("t.orders", "1"): 0}
    keys = {(sample.labels["table"], sample.labels["partition"]): sample.value for sample in families["weir_table_keys"].samples}
    assert keys == {("aggregates", "0"): 3, ("aggregates", "2"): 0}
    worker_state.committed = {TP("t.orders", 0): 9}  # partition 1's commit unknown: counted from offset 0
    lag = {sample.labels["partition"]: sample.value for sample in scraped()["weir_consumer_lag_records"].samples}
    assert lag == {"0": 0, "1": 2}


def test_without_a_worker_the_gauges_are_empty_and_the_rest_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.COLLECTOR, "state", None)
    families = scraped()
    assert families["weir_consumer_lag_records"].samples == []
    assert "weir_dead_letters" in families
    assert "process_cpu_seconds" in families, "the process' own metrics too"


def test_every_weir_metric_follows_the_naming_conventions(worker_state: _State) -> None:
    names = set()
    for family in metrics.REGISTRY.collect():
        if not family.name.startswith("weir_"):
            continue
        names.add(family.name)
        for sample in family.samples:
            assert set(sample.labels) - {"le"} <= BOUNDED_LABELS, f"{sample.name}: unbounded label {sample.labels}"
        if family.type == "counter":
            assert all(sample.name.endswith(("_total", "_created")) for sample in family.samples), family.name
        if family.name.endswith(("_seconds", "_ms", "_milliseconds")):
            assert family.name.endswith("_seconds"), f"{family.name}: durations in seconds"
    assert {"weir_events_handled", "weir_dead_letters", "weir_commit_duration_seconds", "weir_consumer_lag_records"} <= names


def test_the_engine_tells_its_observer_of_each_commit_and_its_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, str]] = []
    monkeypatch.setattr(commit, "_commit_observers", [])
    engine.observe_commits(lambda seconds, outcome: seen.append((seconds, outcome)))
    engine.observe_commits(metrics.commit_observed)
    engine.observe_commits(metrics.commit_observed)
    assert len(commit._commit_observers) == 2, "an observer passed twice is told once"

    async def flush() -> None:
        pass

    tables = SimpleNamespace(_pending_persisted_offsets={})
    manager = SimpleNamespace(
        app=SimpleNamespace(producer=SimpleNamespace(buffer=SimpleNamespace(flush=flush)), consumer_generation_id=1, tables=tables)
    )
    committed = value("weir_commits_total", outcome="committed")
    durations = value("weir_commit_duration_seconds_count")
    assert asyncio.run(commit.commit_transactions(manager, {}))
    assert [outcome for _, outcome in seen] == ["committed"]
    assert seen[0][0] >= 0
    assert value("weir_commits_total", outcome="committed") - committed == 1
    assert value("weir_commit_duration_seconds_count") - durations == 1


def test_install_wires_the_rebalance_count_and_the_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    receivers: set[Any] = set()
    app = SimpleNamespace(on_partitions_assigned=SimpleNamespace(connect=receivers.add))
    monkeypatch.setattr(metrics.COLLECTOR, "state", None)
    monkeypatch.setattr(commit, "_commit_observers", [])
    metrics.install(app)
    metrics.install(app)
    assert receivers == {metrics.count_rebalance}
    assert commit._commit_observers == [metrics.commit_observed]
    assert isinstance(metrics.COLLECTOR.state, metrics.WorkerState)
    assert metrics.COLLECTOR.state.app is app
    before = value("weir_rebalances_total")
    asyncio.run(metrics.count_rebalance(app, assigned=set()))
    assert value("weir_rebalances_total") - before == 1


def _waiting(exchange_id: str) -> Waiting:
    return Waiting(exchange_id, "audit", arrived_ms=1, deadline_ms=2, awaited=("orders",), exchange={}, resume_step=1)


def test_the_patterns_table_gauges_count_what_each_partition_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    barrier_values = [
        BarrierState("k1", waiting=(_waiting("a"), _waiting("b"))).to_dict(),  # release-all: two exchanges on one key
        BarrierState("k2", waiting=(_waiting("c"),)).to_dict(),
        BarrierState("k3").to_dict(),  # only remembered completions
    ]
    triggers = [TriggerState("p1", 1, expected_count=3).to_dict(), TriggerState("p2", 1).to_dict(), TriggerState("p3", 1, 2).to_dict()]
    clients = [ControllerState("c1", 1).to_dict(), ControllerState("c2", 1, closed_ms=5).to_dict(), {"not": "a client"}]
    state = _State(
        committed={},
        ends={},
        values=[
            ("barrier-await-order", 1, barrier_values),
            ("barrier-await-order-deadlines", 1, [{"a": 1}]),  # the barrier's deadline index: no gauge
            ("triggers", 0, triggers),
            ("eof_counters", 3, clients),
        ],
    )
    monkeypatch.setattr(metrics.COLLECTOR, "state", state)
    families = scraped()

    def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(sample.labels.items())): sample.value for sample in families[name].samples}

    assert samples("weir_barrier_waiting_exchanges") == {(("barrier", "await-order"), ("partition", "1")): 3}
    assert samples("weir_trigger_parents_pending") == {(("partition", "0"),): 2}, "registered parents only"
    assert samples("weir_eof_clients_in_flight") == {(("partition", "3"),): 1}, "tombstones and unreadable values left out"
    keys = samples("weir_table_keys")
    assert keys[(("partition", "1"), ("table", "barrier-await-order"))] == 3, "keys, not exchanges"
    assert keys[(("partition", "3"), ("table", "eof_counters"))] == 3
    assert metrics.table_gauge_for("barrier-await-order-deadlines") is None
    assert metrics.table_gauge_for("aggregates") is None
    with pytest.raises(ValueError, match="has no single"):
        metrics.register_table_gauge("stock", metrics.TableGauge("weir_stock", "a label without a pattern", len, label="flavour"))


def test_trigger_fires_are_read_from_the_trigger_consumer_at_scrape_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics.TRIGGER_FIRES, "read", None)
    assert scraped()["weir_trigger_fires"].samples == [], "a process without the trigger consumer shows none"
    fired = {"count": 4, "sweep": 1}
    monkeypatch.setattr(metrics.TRIGGER_FIRES, "read", lambda: fired)
    assert value("weir_trigger_fires_total", fired_by="count") == 4
    assert value("weir_trigger_fires_total", fired_by="sweep") == 1
    fired["sweep"] = 2
    assert value("weir_trigger_fires_total", fired_by="sweep") == 2


def test_barrier_transitions_count_releases_and_failures_by_reason() -> None:
    released = value("weir_barrier_releases_total", barrier="metrics-barrier")
    timeouts = value("weir_barrier_failures_total", barrier="metrics-barrier", reason="timeout")
    metrics.barrier_settled("metrics-barrier", released=2, failed=["timeout", "timeout"])
    metrics.barrier_settled("metrics-barrier")
    assert value("weir_barrier_releases_total", barrier="metrics-barrier") - released == 2
    assert value("weir_barrier_failures_total", barrier="metrics-barrier", reason="timeout") - timeouts == 2


def test_a_commit_that_does_not_commit_counts_an_abort_per_source_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "_abort_observers", [])
    engine.observe_aborts(metrics.transaction_aborted)
    engine.observe_aborts(metrics.transaction_aborted)
    assert commit._abort_observers == [metrics.transaction_aborted]

    async def broken_flush() -> None:
        raise RuntimeError("the producer is gone")

    async def flush() -> None:
        pass

    offsets = {TP("metrics-aborts", 0): 5, TP("metrics-aborts", 2): 9}
    before = {
        partition: value("weir_transaction_aborts_total", topic="metrics-aborts", partition=partition, outcome="failed")
        for partition in "012"
    }
    broken = SimpleNamespace(app=SimpleNamespace(producer=SimpleNamespace(buffer=SimpleNamespace(flush=broken_flush))))
    with pytest.raises(RuntimeError, match="the producer is gone"):
        asyncio.run(commit.commit_transactions(broken, offsets))
    after = {
        partition: value("weir_transaction_aborts_total", topic="metrics-aborts", partition=partition, outcome="failed")
        for partition in "012"
    }
    assert {partition: after[partition] - before[partition] for partition in "012"} == {"0": 1, "1": 0, "2": 1}
    tables = SimpleNamespace(_pending_persisted_offsets={})
    healthy = SimpleNamespace(
        app=SimpleNamespace(producer=SimpleNamespace(buffer=SimpleNamespace(flush=flush)), consumer_generation_id=1, tables=tables)
    )
    assert asyncio.run(commit.commit_transactions(healthy, {}))
    assert value("weir_transaction_aborts_total", topic="metrics-aborts", partition="0", outcome="failed") == after["0"]


def test_a_restore_is_timed_once_from_its_first_start_to_its_first_end(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.tables.recovery import Recovery

    engine.restore.time_restores()  # engine.install did it already: idempotent
    seen: list[float] = []
    monkeypatch.setattr(restore, "_restore_observers", [])
    engine.observe_restores(seen.append)
    engine.observe_restores(metrics.restore_observed)
    recovery: Any = Recovery.__new__(Recovery)
    recovery.app = SimpleNamespace(in_recovery=False, in_transaction=False)
    recovery.in_recovery = False
    recovery._active_events_received_at, recovery._standby_events_received_at = {}, {}
    recovery._processing_times = deque()
    recovery.active_offsets, recovery.active_highwaters = {}, {}  # where reading starts and ends: set in Recovery's __init__
    recovery.standby_tps = set()
    restores = value("weir_restore_duration_seconds_count")
    recovery._set_recovery_started()  # before the changelogs' ends are asked
    recovery._set_recovery_started()  # again when there is something to read: the same restore
    recovery._set_recovery_ended()  # the changelogs are read
    recovery._set_recovery_ended()  # the restore completes: no second restore
    assert len(seen) == 1
    assert seen[0] >= 0
    assert value("weir_restore_duration_seconds_count") - restores == 1
    assert recovery.app.in_recovery is False, "Faust's own bookkeeping still runs"


def test_an_outbox_relay_shows_its_counters_and_the_rows_pending_and_their_wait(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "metrics.sqlite", source="metrics-outbox", clock_ms=lambda: 1_000_000)
    with write(outbox, notify=lambda _: None) as transaction:
        transaction.add(b"1", key=b"k", topic="t")
        transaction.add(b"2", key=b"k", topic="t")
    stats = RelayStats(rounds=3, rows_published=7, signal_wakes=2, safety_wakes=1, publish_failures=1)
    relay = SimpleNamespace(outbox=outbox, stats=stats)
    collector = metrics.OutboxCollector(clock=lambda: 1_004.5)
    assert {family.name for family in collector.describe()} >= {"weir_outbox_rows_pending", "weir_outbox_relay_lag_seconds"}
    collector.relays.append(relay)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value for family in collector.collect() for sample in family.samples
    }
    source = (("outbox", "metrics-outbox"),)
    assert samples[("weir_outbox_rows_pending", source)] == 2
    assert samples[("weir_outbox_relay_lag_seconds", source)] == 4.5, "the oldest pending row was written 4.5 s ago"
    assert samples[("weir_outbox_rows_relayed_total", source)] == 7
    assert samples[("weir_outbox_relay_rounds_total", source)] == 3
    assert samples[("weir_outbox_publish_failures_total", source)] == 1
    assert samples[("weir_outbox_relay_wakes_total", (("cause", "safety"), *source))] == 1
    assert samples[("weir_outbox_relay_wakes_total", (("cause", "signal"), *source))] == 2
    outbox.mark_sent([1, 2], now_ms=1_000_100)
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value for family in collector.collect() for sample in family.samples
    }
    assert samples[("weir_outbox_rows_pending", source)] == 0
    assert samples[("weir_outbox_relay_lag_seconds", source)] == 0
    outbox.close()
