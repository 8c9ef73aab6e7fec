"""A split whose group outgrows a record (issue 37's 10,000-item order): the group completes with what it has
(reason ``too-large``), and every item whose outcome comes after that is dead-lettered with its outcome (reason
``late``): each item is in the result or in a dead letter of its own, none in neither."""

from __future__ import annotations

from typing import Any

import orjson

from weir import Flow, Settings, TestDriver, payload

ITEMS = 400


def priced_orders() -> Flow:
    """A split of an order's items, a step on each, and their aggregate with no timeout (the README's example flow)."""
    return (
        Flow("orders", source="orders")
        .split("items", payload("items"), correlate_by=payload("order_id"))
        .process("price", lambda exchange: {**exchange.payload, "cents": 250})
        .aggregate("order-total", timeout_ms=None)
        .to("priced-orders")
    )


def _index(letter: dict[str, Any]) -> int:
    return int(orjson.loads(letter["value"]["text"])["index"])


def test_every_item_of_a_group_that_outgrew_a_record_is_in_its_result_or_in_a_dead_letter() -> None:
    flow = priced_orders()
    items = [{"sku": f"sku-{index}", "note": "n" * 40} for index in range(ITEMS)]
    with TestDriver([flow], Settings(partitions=1, max_message_bytes=30_000)) as driver:
        driver.pipe("orders", {"order_id": "o-1", "items": items}, key="o-1")
        [result] = driver.values("priced-orders")
        letters = driver.dead_letters()
    assert (result["status"], result["reason"]) == ("partial", "too-large")
    merged = {item["index"] for item in result["items"] if item["status"] == "ok"}
    late = [_index(letter) for letter in letters if letter["reason"] == "late"]
    assert 0 < len(merged) < ITEMS, "the group outgrew a record part of the way"
    assert sorted(late) == sorted(result["missing"]), "each item the result misses is in a dead letter of its own"
    assert merged | set(late) == set(range(ITEMS))
    assert all(orjson.loads(letter["value"]["text"])["ok"] for letter in letters if letter["reason"] == "late"), "with its outcome"


def test_the_issues_order_of_ten_thousand_items_with_the_default_settings_accounts_for_every_item() -> None:
    """The hostile case as found: an order of 10,000 items through a split, a step and an aggregate with weir's default
    settings (a record of at most 1 MB). The group outgrows a record at about 7,000 items; the others are dead-lettered,
    each with its outcome, and none is in neither."""
    count = 10_000
    flow = priced_orders()
    items = [{"sku": f"sku-{index}", "quantity": 1 + index % 3} for index in range(count)]
    with TestDriver([flow], Settings()) as driver:
        driver.pipe("orders", {"order_id": "o-big", "items": items}, key="o-big")
        [result] = driver.values("priced-orders")
        letters = driver.dead_letters()
    merged = {item["index"] for item in result["items"] if item["status"] == "ok"}
    late = [_index(letter) for letter in letters if letter["reason"] == "late"]
    assert (result["status"], result["reason"]) == ("partial", "too-large")
    assert len(late) == len(set(late)), "no item is dead-lettered twice"
    assert merged | set(late) == set(range(count))
    assert not merged & set(late), "no item is both in the result and dead-lettered"
    print(f"{len(merged)} items in the result, {len(late)} dead-lettered late")
