"""Split and aggregate as flow steps, end to end: real broker, real workers running tests/integration/split_flows.py.

Only what needs the broker: a SIGKILL of a flow worker mid-run. The flow's behaviours (steps per item, the merged
result, failed items and a bad order dead-lettered, an aggregate's timeout) run on the test driver:
tests/unit/driver/test_split_flow_driver.py."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from tests.integration.split_flows import PRICES
from tests.integration.test_barrier import send
from weir.app.kafka_io import ensure_topics, read_to_end, read_topic
from weir.app.processes import WorkerProcess

pytestmark = pytest.mark.integration

RESULTS = "flow.orders.order-total.results"
TOPICS = [
    "flow-orders",
    "audit-in",
    "priced-orders",
    "audited",
    "dead-letters",
    "flow.orders.items.items",
    RESULTS,
    "barrier.await-order",
    *[f"flow.{name}.{kind}" for name in ("orders", "audit") for kind in ("resume", "outcomes")],
]
Record = tuple[str, dict[str, Any], dict[str, str]]


def start(pipeline: Pipeline, **overrides: Any) -> WorkerProcess:
    settings = {"WEIR_FLOWS": "tests.integration.split_flows", "TEST_STEP_LOG": str(pipeline.tmp / "steps.log"), "WEIR_RETRY_ATTEMPTS": 2}
    return pipeline.start_worker("flows", **{**settings, **overrides})


def prepare(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))


def make_orders(count: int, *, seed: int, poisoned: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Order id -> its items (1 to 8); the first ``poisoned`` orders have one item of a flavour with no price."""
    rng = random.Random(seed)
    orders = {}
    for number in range(count):
        items = [{"flavour": rng.choice(sorted(PRICES)), "scoops": rng.randint(1, 3)} for _ in range(rng.randint(1, 8))]
        if number < poisoned:
            items.insert(rng.randint(0, len(items)), {"flavour": "durian", "scoops": 1})
        orders[f"o-{seed}-{number}"] = items
    return orders


def order_record(order_id: str, items: list[dict[str, Any]]) -> Record:
    # The audit barrier reads header 'order-id' of flow-orders on entry, before any step: it comes with the order.
    return (order_id, {"order_id": order_id, "screen": "s7", "items": items}, {"order-id": order_id})


def read(pipeline: Pipeline, topic: str, *, expected: int, timeout_s: float, settle_s: float = 2.0) -> list[Any]:
    """Every record once ``expected`` are there, read again after ``settle_s`` to catch a second one."""
    name = pipeline.topic(topic)
    asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: len(rows) >= expected, timeout_s=timeout_s))
    time.sleep(settle_s)
    return asyncio.run(read_to_end(pipeline.bootstrap, name))


def step_runs(pipeline: Pipeline) -> Counter[str]:
    path = pipeline.tmp / "steps.log"
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def assert_priced(priced: list[dict[str, Any]], orders: dict[str, list[dict[str, Any]]]) -> None:
    by_order = Counter(record["order_id"] for record in priced)
    assert not [order for order, count in by_order.items() if count > 1], f"priced twice: {by_order.most_common(3)}"
    assert sorted(by_order) == sorted(orders), f"missing: {sorted(set(orders) - set(by_order))[:5]}"
    for record in priced:
        items = orders[record["order_id"]]
        expected = sum(PRICES[item["flavour"]] * item["scoops"] for item in items if item["flavour"] in PRICES)
        assert record["status"] == "complete", record
        assert record["cents"] == expected, record
        assert record["failed"] == [index for index, item in enumerate(items) if item["flavour"] not in PRICES]
        assert record["missing"] == []
        assert record["screen"] == "s7", "the property set before the split is there after the aggregate"
        assert record["items_saw_header"], "each item ran with the headers the exchange had at the split"


def test_a_sigkill_of_a_flow_worker_mid_run_loses_and_repeats_no_order(pipeline: Pipeline) -> None:
    prepare(pipeline)
    workers = [start(pipeline) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    orders = make_orders(240, seed=2)
    records = [order_record(order_id, items) for order_id, items in orders.items()]
    for number in range(24):
        send(pipeline, "flow-orders", records[number * 10 : (number + 1) * 10])
        if number == 6:
            workers[1].kill()  # its partitions of every stage (orders, items, aggregate, resume) move to the survivor
        time.sleep(0.25)
    priced = [orjson.loads(record.value) for record in read(pipeline, "priced-orders", expected=len(orders), timeout_s=180, settle_s=3)]
    assert_priced(priced, orders)
