"""Split and aggregate as flow steps, end to end: real broker, real workers running tests/integration/split_flows.py."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from app.kafka_io import ensure_topics, read_topic
from app.processes import WorkerProcess
from tests.integration.conftest import Pipeline
from tests.integration.split_flows import PRICES
from tests.integration.test_barrier import send

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
    return asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: False, timeout_s=3.0))


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


def test_a_split_flow_runs_its_steps_per_item_and_goes_on_with_the_merged_result(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start(pipeline).wait_ready()
    orders = make_orders(30, seed=1, poisoned=2)
    send(pipeline, "flow-orders", [order_record(order_id, items) for order_id, items in orders.items()])
    send(pipeline, "flow-orders", [("bad-1", {"order_id": "bad-1", "items": []}, {"order-id": "bad-1"})])
    send(pipeline, "audit-in", [(order_id, {"audit": order_id}, {"order-id": order_id}) for order_id in orders])

    priced = [orjson.loads(record.value) for record in read(pipeline, "priced-orders", expected=len(orders), timeout_s=90)]
    assert_priced(priced, orders)
    audited = read(pipeline, "audited", expected=len(orders), timeout_s=30, settle_s=0.5)
    assert sorted(orjson.loads(record.value)["audit"] for record in audited) == sorted(orders), (
        "the execution's outcome is published after the aggregate and the steps after it: a barrier awaiting the flow is released"
    )
    letters = [orjson.loads(record.value) for record in read(pipeline, "dead-letters", expected=3, timeout_s=10, settle_s=0.5)]
    failed_items = [letter for letter in letters if letter["reason"] == "failed"]
    assert len(failed_items) == 2, letters
    assert all(letter["agent"] == "flow:orders:items" and "no price for flavour 'durian'" in letter["error"] for letter in failed_items)
    assert all(orjson.loads(letter["value"]["text"])["payload"]["flavour"] == "durian" for letter in failed_items), "the item alone"
    [invalid] = [letter for letter in letters if letter["reason"] == "invalid"]
    assert "split 'items': the items must be a non-empty list" in invalid["error"]

    runs = step_runs(pipeline)
    for order_id, items in orders.items():
        assert runs[f"stamp {order_id}"] == 1
        assert runs[f"total {order_id}"] == 1
        for index, item in enumerate(items):
            assert runs[f"price {order_id}#{index}"] == (2 if item["flavour"] not in PRICES else 1), (order_id, index)


def test_a_group_missing_an_item_goes_on_partial_at_the_aggregate_timeout(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start(pipeline, TEST_AGGREGATE_TIMEOUT_MS=2000).wait_ready()
    # A group whose second item never reports (as if its item message were lost): the open the split sends,
    # with the exchange to resume, and the first item's outcome.
    deadline_ms = int(time.time() * 1000) + 2000
    exchange = {"payload": {"order_id": "gap"}, "headers": {"order-id": "gap"}, "properties": {"screen": "s7"}, "key": "gap"}
    context = {"exchange": exchange, "meta": {"exchange_id": "orders@test", "keys": {}}, "resume_step": 5}  # after the aggregate: total, to
    result = {"flavour": "mint", "scoops": 2, "cents": 550, "taxed": 605, "order_header": "gap"}
    messages = [
        ("gap", {"kind": "open", "correlation_id": "gap", "total": 2, "deadline_ms": deadline_ms, "context": context}, {}),
        ("gap", {"kind": "item", "correlation_id": "gap", "total": 2, "index": 0, "last": False, "ok": True, "result": result}, {}),
    ]
    send(pipeline, RESULTS, messages)
    [record] = read(pipeline, "priced-orders", expected=1, timeout_s=30)
    priced = orjson.loads(record.value)
    assert priced["status"] == "partial"
    assert priced["reason"] == "timeout"
    assert priced["missing"] == [1]
    assert priced["cents"] == 550
    assert priced["screen"] == "s7"
    assert time.time() * 1000 >= deadline_ms, "not before the deadline"


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
