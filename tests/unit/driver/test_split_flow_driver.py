"""Split and aggregate as flow steps on the test driver, with the flows the broker tests run (tests/integration/split_flows.py).

A SIGKILL of a flow worker mid-run stays in tests/integration/test_split_flow.py.
"""

from __future__ import annotations

from collections import Counter

from tests.integration.split_flows import make_flows
from tests.integration.test_split_flow import assert_priced, make_orders
from weir import Settings, TestDriver

SETTINGS = Settings(partitions=4, retry_attempts=2)


def test_a_split_flow_runs_its_steps_per_item_and_goes_on_with_the_merged_result() -> None:
    runs: Counter[str] = Counter()
    with TestDriver(make_flows(record=lambda line: runs.update([line])), SETTINGS) as driver:
        orders = make_orders(30, seed=1, poisoned=2)
        for order_id, items in orders.items():
            # The audit barrier reads header 'order-id' of flow-orders on entry, before any step: it comes with the order.
            driver.pipe("flow-orders", {"order_id": order_id, "screen": "s7", "items": items}, key=order_id, headers={"order-id": order_id})
        driver.pipe("flow-orders", {"order_id": "bad-1", "items": []}, key="bad-1", headers={"order-id": "bad-1"})
        for order_id in orders:
            driver.pipe("audit-in", {"audit": order_id}, key=order_id, headers={"order-id": order_id})
        assert_priced(driver.values("priced-orders"), orders)
        assert sorted(record["audit"] for record in driver.values("audited")) == sorted(orders), (
            "the execution's outcome is published after the aggregate and the steps after it: a barrier awaiting the flow is released"
        )
        letters = driver.dead_letters()
    assert len(letters) == 3, letters
    failed_items = [letter for letter in letters if letter["reason"] == "failed"]
    assert len(failed_items) == 2, letters
    assert all(letter["agent"] == "flow:orders:items" and "no price for flavour 'durian'" in letter["error"] for letter in failed_items)
    assert all('"flavour":"durian"' in letter["value"]["text"] for letter in failed_items), "the item alone"
    [invalid] = [letter for letter in letters if letter["reason"] == "invalid"]
    assert "split 'items': the items must be a non-empty list" in invalid["error"]
    for order_id, items in orders.items():
        assert runs[f"stamp {order_id}"] == 1
        assert runs[f"total {order_id}"] == 1
        for index, item in enumerate(items):
            assert runs[f"price {order_id}#{index}"] == (2 if item["flavour"] == "durian" else 1), (order_id, index)


def test_a_group_missing_an_item_goes_on_partial_at_the_aggregate_timeout() -> None:
    with TestDriver(make_flows(timeout_ms=2_000, record=lambda line: None), SETTINGS) as driver:
        # A group whose second item never reports (as if its item message were lost): the open the split sends,
        # with the exchange to resume, and the first item's outcome.
        deadline_ms = driver.clock.now_ms() + 2_000
        exchange = {"payload": {"order_id": "gap"}, "headers": {"order-id": "gap"}, "properties": {"screen": "s7"}, "key": "gap"}
        context = {"exchange": exchange, "meta": {"exchange_id": "orders@test", "keys": {}}, "resume_step": 5}  # after the aggregate
        result = {"flavour": "mint", "scoops": 2, "cents": 550, "taxed": 605, "order_header": "gap"}
        results = "flow.orders.order-total.results"
        driver.pipe(
            results, {"kind": "open", "correlation_id": "gap", "total": 2, "deadline_ms": deadline_ms, "context": context}, key="gap"
        )
        item = {"kind": "item", "correlation_id": "gap", "total": 2, "index": 0, "last": False, "ok": True, "result": result}
        driver.pipe(results, item, key="gap")
        driver.advance(ms=1_500)
        assert driver.values("priced-orders") == [], "not before the deadline"
        driver.advance(ms=1_500)
        [priced] = driver.values("priced-orders")
    assert priced["status"] == "partial"
    assert priced["reason"] == "timeout"
    assert priced["missing"] == [1]
    assert priced["cents"] == 550
    assert priced["screen"] == "s7"
