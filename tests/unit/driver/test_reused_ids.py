"""A second, different input that reuses a group's id (issue 37: a second order with the same order id got no result
and no dead letter): its messages are dead-lettered (reason ``duplicate-id``), never merged into the other's group,
and it gets its one result, ``invalid``; a redelivery of the first (the same origin) is still merged once."""

from __future__ import annotations

from typing import Any

from weir import Flow, Settings, TestDriver, payload

SETTINGS = Settings(partitions=1)


def _order(order_id: str, skus: list[str]) -> dict[str, Any]:
    return {"order_id": order_id, "items": [{"sku": sku} for sku in skus]}


def test_a_second_order_reusing_an_id_gets_an_invalid_result_and_its_items_are_dead_lettered() -> None:
    with TestDriver(settings=SETTINGS, item_step=lambda item: {**item, "priced": True}) as driver:
        driver.pipe("orders", _order("o-1", ["a", "b"]), key="o-1")
        driver.pipe("orders", _order("o-1", ["x", "y", "z"]), key="o-1")  # another order, the same id
        results = driver.values("aggregates")
        letters = driver.dead_letters()
    assert [(result["status"], result.get("reason")) for result in results] == [("complete", "flag"), ("invalid", "duplicate-id")]
    assert [item["result"]["sku"] for item in results[0]["items"]] == ["a", "b"], "the first order's group is untouched"
    assert [letter["reason"] for letter in letters] == ["duplicate-id"]
    assert "another input reusing the id" in letters[0]["error"]


def test_a_second_order_of_several_chunks_reusing_an_open_group_s_id_is_not_merged_into_it() -> None:
    flow = (
        Flow("orders", source="orders")
        .split("items", payload("items"), correlate_by=payload("order_id"), chunk=2)
        .process("price", lambda exchange: {**exchange.payload, "cents": 100})
        .aggregate("order-total", timeout_ms=60_000)
        .to("priced")
    )
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("orders", _order("o-7", ["a", "b", "c", "d", "e"]), key="o-7", run=False)
        driver.pipe("orders", _order("o-7", ["v", "w", "x", "y", "z"]), key="o-7", run=False)  # both split before any merge
        driver.run()
        results = driver.values("priced")
        letters = driver.dead_letters()
    by_status = {result["status"]: result for result in results}
    assert sorted(by_status) == ["complete", "invalid"]
    assert [item["result"]["sku"] for item in by_status["complete"]["items"]] == ["a", "b", "c", "d", "e"]
    assert by_status["invalid"]["reason"] == "duplicate-id"
    assert {letter["reason"] for letter in letters} == {"duplicate-id"}
    assert len(letters) == 1 + 3, "the second order's open and its three chunks' outcomes, each in a dead letter"


def test_a_crash_replays_the_same_order_as_itself_not_as_a_reused_id() -> None:
    with TestDriver(settings=SETTINGS, item_step=lambda item: item) as reference:
        reference.pipe("orders", _order("o-2", [f"s{n}" for n in range(25)]), key="o-2")
        expected = reference.values("aggregates")
        handled = reference.events_handled
    for crash_at in range(1, handled):
        with TestDriver(settings=SETTINGS, item_step=lambda item: item) as driver:
            driver.crash_after(crash_at)
            driver.pipe("orders", _order("o-2", [f"s{n}" for n in range(25)]), key="o-2")
            assert driver.crashes == 1
            assert driver.values("aggregates") == expected, f"a crash after {crash_at} events"
            assert driver.dead_letters() == []
