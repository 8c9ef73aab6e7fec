"""/metrics of real workers (and of a relay process): parsed by the Prometheus client's own parser, the counters moved
by what the test sent: orders, barrier exchanges, trigger parents, outbox rows."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT
from tests.integration.conftest import Pipeline, free_port
from tests.integration.test_barrier import BARRIER, dispatch, kitchen, payment, prepare, send, start_flows
from weir.app.kafka_io import ensure_topics, produce, produce_json, read_topic
from weir.app.outbox import Doorbell, open_outbox, write
from weir.app.processes import WorkerProcess
from weir.app.trigger_status import child_done
from weir.tables.triggers import (
    DEFAULT_WAKE_TOPIC,
    TRIGGERS_TOPIC,
    completion_message,
    publish_trigger_messages,
    registration_message,
)

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
ORDERS = 5

#: One scrape: (sample name, sorted labels) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(worker: WorkerProcess | str) -> Samples:
    """Every sample of the worker's /metrics (or of the /metrics at that URL): (name, sorted labels) -> value."""
    url = worker if isinstance(worker, str) else f"http://127.0.0.1:{worker.web_port}/metrics"
    with urllib.request.urlopen(url, timeout=20) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(value for (found, sample_labels), value in samples.items() if found == name and set(labels.items()) <= set(sample_labels))


def scrape_until(worker: WorkerProcess | str, condition: Callable[[Samples], bool], *, what: str, timeout_s: float = 60) -> Samples:
    deadline = time.monotonic() + timeout_s
    samples: Samples = {}
    while time.monotonic() < deadline:
        try:
            samples = scrape(worker)
        except OSError:  # not listening yet
            time.sleep(0.5)
            continue
        if condition(samples):
            return samples
        time.sleep(0.5)
    weir = {key: value for key, value in samples.items() if key[0].startswith("weir_")}
    pytest.fail(f"{what}: not true after {timeout_s}s; last scrape: {weir}")


def test_a_worker_counts_what_it_handled_and_dead_lettered_and_its_lag_falls_to_zero(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    worker = pipeline.start_worker("all")
    worker.wait_ready()
    orders_topic = pipeline.topic("orders")
    orders: list[tuple[str, Any]] = [
        (f"o-{number}", {"order_id": f"o-{number}", "items": [{"value": number}, {"value": -number}]}) for number in range(ORDERS)
    ]
    asyncio.run(produce_json(pipeline.bootstrap, orders_topic, orders))
    asyncio.run(produce(pipeline.bootstrap, orders_topic, [(b"bad-1", b"{not json"), (b"bad-2", b'{"order_id": "o-x"}')]))
    # every input is answered on the aggregates topic, the two bad ones with a failed result
    results = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("aggregates"), until=lambda rows: len(rows) >= ORDERS + 2, timeout_s=120)
    )
    assert len(results) == ORDERS + 2

    samples = scrape_until(
        worker,
        lambda samples: (
            total(samples, "weir_events_handled_total", agent="splitter") >= ORDERS + 2
            and total(samples, "weir_consumer_lag_records", topic=orders_topic) == 0
            and len([key for key in samples if key[0] == "weir_consumer_lag_records" and dict(key[1])["topic"] == orders_topic]) == 4
        ),
        what="every order handled, and the orders topic's lag 0 on each of its 4 partitions",
    )
    assert total(samples, "weir_dead_letters_total", agent="splitter", reason="undecodable") == 1
    assert total(samples, "weir_dead_letters_total", agent="splitter", reason="invalid") == 1
    # records, not orders: the splitter bundles the chunks of orders bound for one partition into one record
    assert total(samples, "weir_events_handled_total", agent="items") >= 1
    assert total(samples, "weir_records_handled_total", topic=orders_topic) == ORDERS + 2
    assert total(samples, "weir_batch_events_count") >= 1
    assert total(samples, "weir_commits_total", outcome="committed") >= 1
    assert total(samples, "weir_commit_duration_seconds_count") >= 1
    assert total(samples, "weir_rebalances_total") >= 1
    assert total(samples, "weir_table_keys", table="aggregates_done") == ORDERS, "the completed groups this worker remembers"
    assert total(samples, "weir_table_keys", table="aggregates") == 0, "no group left open"
    # Each order is one chunk of two items whose last is flagged: every group completes by flag, once.
    assert total(samples, "weir_aggregate_completions_total", aggregator="order-items", status="complete", reason="flag") == ORDERS
    assert total(samples, "weir_aggregate_completions_total") == ORDERS
    assert total(samples, "weir_aggregate_duplicates_total") == 0
    assert total(samples, "process_cpu_seconds_total") > 0


def test_a_barrier_worker_counts_the_exchanges_it_released_and_shows_those_waiting(pipeline: Pipeline) -> None:
    prepare(pipeline)
    worker = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=600_000)
    worker.wait_ready()
    released = [f"o-{number}" for number in range(6)]
    send(pipeline, "dispatch-in", [dispatch(order) for order in [*released, "o-waits"]])
    send(pipeline, "kitchen", [kitchen(order) for order in [*released, "o-waits"]])
    send(pipeline, "payment", [payment(order) for order in released])  # o-waits still awaits its payment
    dispatched = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("dispatched"), until=lambda rows: len(rows) >= len(released), timeout_s=90)
    )
    assert sorted(orjson.loads(message.value)["order_id"] for message in dispatched) == released
    samples = scrape_until(
        worker,
        lambda samples: (
            total(samples, "weir_barrier_releases_total", barrier=BARRIER) >= len(released)
            and total(samples, "weir_barrier_waiting_exchanges", barrier=BARRIER) == 1
        ),
        what="the released exchanges counted and the one left waiting shown",
    )
    assert total(samples, "weir_barrier_releases_total", barrier=BARRIER) == len(released), "each release counted once"
    assert total(samples, "weir_barrier_failures_total") == 0
    waiting = [key for key in samples if key[0] == "weir_barrier_waiting_exchanges" and dict(key[1])["barrier"] == BARRIER]
    assert len(waiting) == 4, "one sample per partition of the barrier's table this worker owns (all 4)"
    assert total(samples, "weir_barrier_waiting_exchanges", barrier="await-dispatch") == 0, "the notify flow's barrier holds none"
    assert total(samples, "weir_table_keys", table=f"barrier-{BARRIER}") >= 1
    assert total(samples, "weir_restore_duration_seconds_count") >= 1, "the worker's restore at its first assignment is timed"
    assert total(samples, "weir_transaction_aborts_total") == 0


def test_a_trigger_worker_counts_firings_by_cause_and_shows_the_parents_still_pending(pipeline: Pipeline, tmp_path: Path) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(TRIGGERS_TOPIC), pipeline.topic(DEFAULT_WAKE_TOPIC)], 4))
    children_db = str(tmp_path / "children.sqlite")
    counted = [f"counted-{number}" for number in range(5)]  # every completion arrives: fired by count
    lost = [f"lost-{number}" for number in range(3)]  # one completion lost, every status committed: fired by the sweep
    outbox = open_outbox(children_db)
    with write(outbox, notify=lambda _: None) as tx:  # the children's committed statuses (their outbox rows never relayed)
        for parent in lost:
            child_done(tx, parent, "a", "ok", topic_prefix=pipeline.prefix)
            child_done(tx, parent, "b", "ok", topic_prefix=pipeline.prefix)
    outbox.close()
    worker = pipeline.start_worker("triggers", WEIR_SWEEP_INTERVAL_MS=500, WEIR_SWEEP_GRACE_MS=1000, WEIR_TRIGGER_STATUS_DB=children_db)
    worker.wait_ready()
    messages = [registration_message(parent, 2) for parent in [*counted, *lost, "pending"]]
    for parent in counted:
        messages += [completion_message(parent, "a"), completion_message(parent, "b")]
    for parent in lost:
        messages.append(completion_message(parent, "a"))
    messages.append(completion_message("pending", "a"))  # its second child never ends: the parent stays pending
    asyncio.run(publish_trigger_messages(pipeline.bootstrap, pipeline.prefix, messages))
    fired = len(counted) + len(lost)
    wakes = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic(DEFAULT_WAKE_TOPIC), until=lambda rows: len(rows) >= fired, timeout_s=90)
    )
    by_cause = Counter(orjson.loads(message.value)["fired_by"] for message in wakes)
    assert by_cause == {"count": len(counted), "sweep": len(lost)}
    samples = scrape_until(
        worker,
        lambda samples: total(samples, "weir_trigger_fires_total") >= fired and total(samples, "weir_trigger_parents_pending") == 1,
        what="every firing counted and the one parent left pending shown",
    )
    assert total(samples, "weir_trigger_fires_total", fired_by="count") == len(counted)
    assert total(samples, "weir_trigger_fires_total", fired_by="sweep") == len(lost)
    assert total(samples, "weir_trigger_fires_total") == fired, "no parent fired twice"
    assert total(samples, "weir_eof_clients_in_flight") == 0, "a gauge of a table this worker does not have shows nothing"


def test_a_relay_process_serves_rows_relayed_and_the_rows_pending_with_their_wait(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = f"t{os.urandom(4).hex()}.outbox"
    asyncio.run(ensure_topics(kafka_bootstrap, [topic], 3))
    database = tmp_path / "outbox.sqlite"
    outbox = open_outbox(str(database), source="metrics-relay")
    port = free_port()
    command = [sys.executable, "-m", "weir.app.outbox_relay", "--db", str(database), "--source", "metrics-relay", "--topic", topic]
    command += ["--metrics-port", str(port), "--safety-timeout", "600"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KAFKA_BOOTSTRAP": kafka_bootstrap}
    with (tmp_path / "relay.log").open("wb") as log:
        relay = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        scrape_until(url, lambda samples: total(samples, "weir_outbox_rows_pending", outbox="metrics-relay") == 0, what="the relay up")
        # Its metrics are served before its doorbell listens: a ring before "ready" finds no listener.
        ready_by = time.monotonic() + 60
        while "outbox relay ready" not in (tmp_path / "relay.log").read_text() and time.monotonic() < ready_by:
            time.sleep(0.1)
        with write(outbox) as transaction:  # rings the relay's doorbell after the commit
            for number in range(5):
                transaction.add(orjson.dumps({"n": number}), key=f"k-{number}")
        samples = scrape_until(
            url,
            lambda samples: total(samples, "weir_outbox_rows_relayed_total", outbox="metrics-relay") == 5,
            what="the five rows relayed",
        )
        assert total(samples, "weir_outbox_rows_pending", outbox="metrics-relay") == 0
        assert total(samples, "weir_outbox_relay_lag_seconds", outbox="metrics-relay") == 0
        assert total(samples, "weir_outbox_relay_wakes_total", outbox="metrics-relay", cause="signal") >= 1
        # Three rows whose writer does not ring the doorbell (a lost wake-up): they wait, for the safety timer (600 s here).
        with write(outbox, notify=lambda _: None) as transaction:
            for number in range(3):
                transaction.add(orjson.dumps({"n": 5 + number}), key="late")
        time.sleep(1.5)
        samples = scrape(url)
        assert total(samples, "weir_outbox_rows_pending", outbox="metrics-relay") == 3
        assert total(samples, "weir_outbox_relay_lag_seconds", outbox="metrics-relay") >= 1.0, "the oldest has waited 1.5 s"
        assert total(samples, "weir_outbox_rows_relayed_total", outbox="metrics-relay") == 5
        Doorbell(outbox.doorbell_path).ring(outbox.newest_id())
        samples = scrape_until(
            url,
            lambda samples: total(samples, "weir_outbox_rows_relayed_total", outbox="metrics-relay") == 8,
            what="the three late rows relayed once the doorbell rang",
        )
        assert total(samples, "weir_outbox_rows_pending", outbox="metrics-relay") == 0
        assert total(samples, "weir_outbox_publish_failures_total", outbox="metrics-relay") == 0
        assert total(samples, "weir_outbox_relay_wakes_total", outbox="metrics-relay", cause="safety") == 0
        assert total(samples, "weir_outbox_relay_rounds_total", outbox="metrics-relay") >= 2
    finally:
        os.killpg(relay.pid, signal.SIGTERM)
        relay.wait(30)
        outbox.close()
