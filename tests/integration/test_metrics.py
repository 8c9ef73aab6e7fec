"""/metrics of a real worker: parsed by the Prometheus client's own parser, its counters moved by the orders sent."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.kafka_io import ensure_topics, produce, produce_json, read_topic
from app.processes import WorkerProcess
from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
ORDERS = 5

#: One scrape: (sample name, sorted labels) -> value.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(worker: WorkerProcess) -> Samples:
    """Every sample of the worker's /metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.web_port}/metrics", timeout=20) as response:
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


def scrape_until(worker: WorkerProcess, condition: Callable[[Samples], bool], *, what: str, timeout_s: float = 60) -> Samples:
    deadline = time.monotonic() + timeout_s
    samples: Samples = {}
    while time.monotonic() < deadline:
        samples = scrape(worker)
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
    assert total(samples, "weir_events_handled_total", agent="items") >= ORDERS
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
