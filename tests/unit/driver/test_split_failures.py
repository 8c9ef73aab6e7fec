"""A split's failed item (Camel's stopOnException and shareUnitOfWork) on the driver: merged and waited past
(``continue``), the group ended failed at it (``stop``), or the parent failed as one (``fail-parent``)."""

from __future__ import annotations

from typing import Any

import pytest

from weir import Exchange, Flow, FlowDeclarationError, Settings, TestDriver, payload

SETTINGS = Settings(partitions=2, retry_attempts=2, retry_backoff_ms=10, retry_max_backoff_ms=10, split_chunk=1)


def flow(on_item_failure: str, ran: list[int]) -> Flow:
    def step(exchange: Exchange) -> Any:
        ran.append(exchange.payload)
        if exchange.payload == 2:
            raise ValueError("item 2 is bad")
        return exchange.payload * 10

    return (
        Flow("orders", source="orders")
        .split("items", payload("items"))
        .process("price", step)
        .aggregate("all", timeout_ms=None, on_item_failure=on_item_failure)
        .to("out")
    )


def test_continue_merges_the_failed_item_and_waits_for_the_others() -> None:
    with TestDriver([flow("continue", [])], SETTINGS) as driver:
        driver.pipe("orders", {"items": [1, 2, 3]}, key="o-1")
        [result] = driver.values("out")
    assert (result["status"], result["failed"]) == ("complete", [1])
    assert [item["status"] for item in result["items"]] == ["ok", "failed", "ok"]


def test_stop_ends_the_group_failed_at_the_first_failed_item_and_counts_later_ones_late() -> None:
    with TestDriver([flow("stop", [])], SETTINGS) as driver:
        driver.pipe("orders", {"items": [1, 2, 3]}, key="o-1")
        [result] = driver.values("out")
        done = driver.table("flow-orders-all-done")
    assert (result["status"], result["reason"], result["failed_item"]) == ("failed", "item-failed", 1)
    assert result["error"] == "item 1 failed: step 'price': ValueError: item 2 is bad"
    assert [item["status"] for item in result["items"]] == ["ok", "failed", "missing"], "the item after it was not merged"
    [state] = done.values()
    assert state["status"] == "failed"
    assert state["late_indexes"] == [2], "its outcome came after the end: counted late"


def test_fail_parent_dead_letters_the_whole_exchange_and_ends_its_execution_failed() -> None:
    with TestDriver([flow("fail-parent", [])], SETTINGS) as driver:
        driver.pipe("orders", {"items": [1, 2, 3]}, key="o-1", headers={"trace": "t-1"})
        assert driver.values("out") == [], "the parent does not go on"
        letters = [letter for letter in driver.dead_letters() if letter["reason"] == "item-failed"]
        outcomes = driver.values("flow.orders.outcomes")
    [letter] = letters
    assert letter["agent"] == "flow:orders"
    assert "item 1 failed" in letter["error"]
    assert letter["result"]["failed_item"] == 1
    assert '"items":[1,2,3]' in (letter["value"]["text"] or "").replace(" ", "")
    assert [(outcome["outcome"], "item 1 failed" in outcome["error"]) for outcome in outcomes] == [("failed", True)]


def test_the_rule_is_checked_where_it_is_declared() -> None:
    with pytest.raises(FlowDeclarationError, match="on_item_failure must be one of"):
        flow("ignore", [])
    with pytest.raises(FlowDeclarationError, match="belongs to an aggregate after a split"):
        Flow("g", source="in").aggregate("by-key", timeout_ms=1_000, correlate_by=payload("k"), on_item_failure="stop")


def test_fail_parent_s_dead_letter_fits_a_record_with_tens_of_thousands_of_items() -> None:
    """The failed and missing indexes go into the dead letter as an outline (a sample, the count, a sha256): with the
    whole lists, a group of 30,000 items failing at its first left no dead letter at all (the fitting refused it: the
    29,500 missing indexes alone were over the record limit)."""
    settings = Settings(partitions=1, retry_attempts=1, split_chunk=500, max_message_bytes=180_000)  # item 0 first

    def step(exchange: Exchange) -> Any:
        if exchange.payload == 0:
            raise ValueError("item 0 is bad")
        return exchange.payload

    big = (
        Flow("orders", source="orders")
        .split("items", payload("items"))
        .process("check", step)
        .aggregate("all", timeout_ms=None, on_item_failure="fail-parent")
        .to("out")
    )
    with TestDriver([big], settings) as driver:
        driver.pipe("orders", {"items": list(range(30_000))}, key="o-1")
        letters = [letter for letter in driver.dead_letters() if letter["reason"] == "item-failed"]
        outcomes = driver.values("flow.orders.outcomes")
    [letter] = letters
    result = letter["result"]
    assert (result["failed_item"], result["failed"], result["failed_count"]) == (0, [0], 1)
    assert result["missing_count"] >= 20_000
    assert len(result["missing"]) == 100
    assert result["missing_sha256"]
    assert [outcome["outcome"] for outcome in outcomes] == ["failed"]


@pytest.mark.parametrize("rule", ["stop", "fail-parent"])
def test_a_chunks_items_after_the_failed_one_are_not_run(rule: str) -> None:
    """Camel's sequential stopOnException: the items of one message (a chunk) run in turn, and those after the failing
    one are not run. Items of other chunks, handed to other workers, still run (the parallel case)."""
    ran: list[int] = []
    settings = Settings(partitions=1, retry_attempts=1, split_chunk=10)
    with TestDriver([flow(rule, ran)], settings) as driver:
        driver.pipe("orders", {"items": [1, 2, 3, 4, 5]}, key="o-1")
        letters = [letter for letter in driver.dead_letters() if letter["reason"] == "failed"]
    assert ran == [1, 2], "3, 4 and 5 came after the failed item in its chunk"
    assert len(letters) == 1, "only the item that failed is dead-lettered, not those never run"


def test_with_continue_every_item_runs() -> None:
    ran: list[int] = []
    with TestDriver([flow("continue", ran)], Settings(partitions=1, retry_attempts=1, split_chunk=10)) as driver:
        driver.pipe("orders", {"items": [1, 2, 3, 4, 5]}, key="o-1")
        [result] = driver.values("out")
    assert ran == [1, 2, 3, 4, 5]
    assert [item["status"] for item in result["items"]] == ["ok", "failed", "ok", "ok", "ok"]


def test_the_rule_may_be_said_on_the_split_as_camel_does() -> None:
    ran: list[int] = []

    def step(exchange: Exchange) -> Any:
        ran.append(exchange.payload)
        if exchange.payload == 2:
            raise ValueError("item 2 is bad")
        return exchange.payload

    on_split = (
        Flow("orders", source="orders")
        .split("items", payload("items"), on_item_failure="stop")
        .process("price", step)
        .aggregate("all", timeout_ms=None)
        .to("out")
    )
    with TestDriver([on_split], Settings(partitions=1, retry_attempts=1, split_chunk=10)) as driver:
        driver.pipe("orders", {"items": [1, 2, 3]}, key="o-1")
        [result] = driver.values("out")
    assert (result["status"], result["reason"], result["failed_item"]) == ("failed", "item-failed", 1)
    assert ran == [1, 2]
    with pytest.raises(FlowDeclarationError, match="say it once"):
        Flow("g", source="in").split("s", payload("items"), on_item_failure="stop").aggregate(
            "a", timeout_ms=None, on_item_failure="fail-parent"
        )
    with pytest.raises(FlowDeclarationError, match="on_item_failure must be one of"):
        Flow("g", source="in").split("s", payload("items"), on_item_failure="ignore")
