"""The in-process test driver: flows on weir's own stage code, in-memory topics, a virtual clock, simulated crashes."""

from __future__ import annotations

from typing import Any

import pytest

from weir import Exchange, Flow, Settings, TestDriver, header, payload

SETTINGS = Settings(partitions=3, retry_attempts=3, retry_backoff_ms=100, retry_max_backoff_ms=1_000)


def _price(exchange: Exchange) -> dict[str, Any]:
    item = exchange.payload
    if item.get("qty", 0) < 0:
        raise ValueError(f"negative quantity {item['qty']}")
    return {"sku": item["sku"], "price": 2 * item["qty"]}


def _orders() -> Flow:
    return (
        Flow("orders", source="orders")
        .split("items", payload("items"), correlate_by=payload("order_id"))
        .process("price", _price)
        .aggregate("order-total", timeout_ms=30_000)
        .to("priced-orders")
    )


def _order(order_id: str, *quantities: int) -> dict[str, Any]:
    return {"order_id": order_id, "items": [{"sku": f"s{index}", "qty": qty} for index, qty in enumerate(quantities)]}


def test_a_split_order_comes_back_merged_with_every_item_priced() -> None:
    with TestDriver([_orders()], SETTINGS) as driver:
        driver.pipe("orders", _order("o-1", 1, 3, 5), key="o-1")
        [result] = driver.values("priced-orders")
    assert result["correlation_id"] == "o-1"
    assert result["status"] == "complete"
    assert [item["result"]["price"] for item in result["items"]] == [2, 6, 10]
    assert driver.dead_letters() == []


def test_a_failing_item_is_retried_on_the_virtual_clock_then_reported_failed_and_dead_lettered() -> None:
    with TestDriver([_orders()], SETTINGS) as driver:
        began = driver.clock.now_ms()
        driver.pipe("orders", _order("o-2", 1, -1), key="o-2")
        [result] = driver.values("priced-orders")
        waited = driver.clock.now_ms() - began
    assert result["status"] == "complete"
    assert [item["status"] for item in result["items"]] == ["ok", "failed"]
    assert "negative quantity -1" in result["items"][1]["error"]
    # three attempts: two backoffs of the policy (100 ms, then 200 ms), on the virtual clock, not the wall's
    assert waited == 300
    [letter] = driver.dead_letters()
    assert letter["reason"] == "failed"
    assert letter["attempts"] == 3


def test_a_step_that_succeeds_on_its_third_attempt_is_ok() -> None:
    attempts: dict[str, int] = {}

    def flaky(exchange: Exchange) -> Any:
        sku = exchange.payload["sku"]
        attempts[sku] = attempts.get(sku, 0) + 1
        if attempts[sku] < 3:
            raise ConnectionError("service unavailable")
        return {"sku": sku}

    flow = Flow("f", source="in").split("items", payload("items")).process("call", flaky).aggregate("all", timeout_ms=None).to("out")
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("in", _order("o-3", 1, 1), key="o-3")
        [result] = driver.values("out")
    assert [item["status"] for item in result["items"]] == ["ok", "ok"]
    assert attempts == {"s0": 3, "s1": 3}
    assert driver.dead_letters() == []


def test_a_group_by_key_times_out_partial_when_the_clock_passes_its_deadline() -> None:
    flow = (
        Flow("batches", source="lines")
        .aggregate("per-customer", correlate_by=header("customer"), complete_size=3, timeout_ms=10_000)
        .to("batched")
    )
    with TestDriver([flow], SETTINGS) as driver:
        for line in ("a", "b"):
            driver.pipe("lines", {"line": line}, key="c-1", headers={"customer": "c-1"})
        assert driver.values("batched") == []
        driver.advance(seconds=9)
        assert driver.values("batched") == [], "nothing completes before the deadline"
        driver.advance(seconds=2)
        [result] = driver.values("batched")
    assert result["status"] == "partial"
    assert [item["result"] for item in result["items"]] == [{"line": "a"}, {"line": "b"}]


def _shop() -> list[Flow]:
    kitchen = Flow("kitchen", source="kitchen").process("cook", lambda exchange: {**exchange.payload, "cooked": True})
    payment = Flow("payment", source="payment").process("charge", lambda exchange: {**exchange.payload, "charged": True})
    dispatch = (
        Flow("dispatch", source="dispatch")
        .barrier("ready", correlate_by=payload("order_id"), awaits=["kitchen", "payment"], timeout_ms=60_000)
        .to("dispatched")
    )
    return [kitchen, payment, dispatch]


@pytest.mark.parametrize(
    "order", [("dispatch", "kitchen", "payment"), ("kitchen", "payment", "dispatch"), ("kitchen", "dispatch", "payment")]
)
def test_a_barrier_releases_its_exchange_once_both_awaited_flows_completed_in_any_order(order: tuple[str, ...]) -> None:
    with TestDriver(_shop(), SETTINGS) as driver:
        for topic in order:
            assert driver.values("dispatched") == []
            driver.pipe(topic, {"order_id": "o-9"}, key="o-9")
        assert driver.values("dispatched") == [{"order_id": "o-9"}]
        assert driver.dead_letters() == []


def test_a_barrier_dead_letters_its_exchange_at_the_timeout_naming_what_it_still_waited_for() -> None:
    with TestDriver(_shop(), SETTINGS) as driver:
        driver.pipe("dispatch", {"order_id": "o-7"}, key="o-7")
        driver.pipe("kitchen", {"order_id": "o-7"}, key="o-7")
        driver.advance(seconds=59)
        assert driver.dead_letters() == []
        driver.advance(seconds=2)
        [letter] = driver.dead_letters()
        assert letter["reason"] == "timeout"
        assert letter["awaiting"] == [{"flow": "payment", "key": "o-7"}]
        driver.pipe("payment", {"order_id": "o-7"}, key="o-7")
        assert driver.values("dispatched") == [], "a late completion releases nothing"
        [outcome] = [record for record in driver.values("flow.dispatch.outcomes")]
        assert outcome["outcome"] == "failed"


def test_an_undecodable_record_is_dead_lettered_and_the_next_one_goes_on() -> None:
    with TestDriver([_orders()], SETTINGS) as driver:
        driver.pipe("orders", b"{not json", key="o-bad")
        driver.pipe("orders", _order("o-good", 2), key="o-good")
        [letter] = driver.dead_letters()
        assert letter["reason"] == "undecodable"
        assert [result["correlation_id"] for result in driver.values("priced-orders")] == ["o-good"]


def _outputs_of(driver: TestDriver) -> dict[str, list[Any]]:
    """What a run's consumers saw: the results, the dead letters, the barrier's releases (times left out: a crash takes
    time, as a retry's backoff does)."""
    dead = sorted((letter["agent"], letter["reason"], letter["key"]["text"]) for letter in driver.dead_letters())
    priced = sorted(
        repr(sorted((name, value) for name, value in result.items() if not name.endswith("_ms")))
        for result in driver.values("priced-orders")
    )
    return {"priced": priced, "dispatched": sorted(repr(value) for value in driver.values("dispatched")), "dead": dead}


def _scenario(driver: TestDriver) -> None:
    for number in range(4):
        driver.pipe("orders", _order(f"o-{number}", 1, 2, -1 if number == 2 else 3), key=f"o-{number}")
    for topic in ("dispatch", "kitchen", "payment"):
        driver.pipe(topic, {"order_id": "o-1"}, key="o-1")


def _everything() -> list[Flow]:
    return [_orders(), *_shop()]


def test_a_crash_at_any_event_before_a_commit_changes_no_output() -> None:
    """Exactly-once in the driver: rolled back to the last commit, the same inputs read again, the same outputs once."""
    with TestDriver(_everything(), SETTINGS) as reference:
        _scenario(reference)
        expected = _outputs_of(reference)
        handled = reference.events_handled
    assert (len(expected["priced"]), len(expected["dispatched"]), len(expected["dead"])) == (4, 1, 1)
    assert handled > 20
    for crash_at in range(1, handled):
        with TestDriver(_everything(), SETTINGS) as driver:
            driver.crash_after(crash_at)
            _scenario(driver)
            assert driver.crashes == 1
            assert _outputs_of(driver) == expected, f"a crash after {crash_at} events"


def test_the_crash_test_can_fail_a_replay_on_kept_writes_sends_twice() -> None:
    """Crashed after the split sent its items: with the rollback, the aborted send is never seen; a crash that only
    rewinds the positions (no abort, no table restore) sends the items a second time."""
    with TestDriver([_orders()], SETTINGS) as driver:
        driver.crash_after(1)
        driver.pipe("orders", _order("o-1", 1), key="o-1")
        assert driver.crashes == 1
        assert len(driver.read("flow.orders.items.items")) == 1
    with TestDriver([_orders()], SETTINGS) as broken:

        def rewind_only() -> None:
            broken.crashes += 1
            broken._positions = dict(broken._committed_positions)

        broken._roll_back = rewind_only  # type: ignore[method-assign]
        broken.crash_after(1)
        broken.pipe("orders", _order("o-1", 1), key="o-1")
        assert broken.crashes == 1
        assert len(broken.read("flow.orders.items.items")) == 2, "the split's item message, sent twice"
