"""A split group asks for its missing items again before its deadline (WEIR_AGGREGATE_REREQUEST_MS, a bounded count).

Camel's and Spring's "retry the missing parts" expectation on weir's pipeline: the open carries the items' payloads,
the aggregate re-sends a missing item to the items topic under a key of its own (another partition than a stuck
worker's, maybe), and its outcome merges by index, once, whichever copy comes first. On the test driver with its
virtual clock; the lost item messages are made by piping the open and some outcomes straight to the aggregate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from weir import Settings, TestDriver
from weir.app.pipeline import PipelineTopology
from weir.tables.aggregates import AggregatorConfig, GroupState, on_expire, on_open

SETTINGS = Settings(partitions=2, aggregate_timeout_ms=10_000, aggregate_rerequest_ms=2_000, aggregate_rerequests=2, split_chunk=2)


def price(payload: Any) -> Any:
    return {"value": payload, "doubled": payload * 2}


def open_message(driver: TestDriver, total: int) -> dict[str, Any]:
    return {
        "kind": "open",
        "correlation_id": "o-1",
        "total": total,
        "deadline_ms": driver.clock.now_ms() + 10_000,
        "items": list(range(total)),
    }


def outcome(index: int, total: int) -> dict[str, Any]:
    return {
        "kind": "item",
        "correlation_id": "o-1",
        "total": total,
        "index": index,
        "last": index == total - 1,
        "ok": True,
        "result": price(index),
        "error": None,
        "attempts": 1,
    }


def test_missing_items_are_asked_for_again_and_the_group_completes_whole_before_its_deadline() -> None:
    with TestDriver(settings=SETTINGS, item_step=price) as driver:
        driver.pipe("item-results", open_message(driver, 4), key="o-1")
        for index in (0, 1):  # the item messages of 2 and 3 were lost: their outcomes never come
            driver.pipe("item-results", outcome(index, 4), key="o-1")
        driver.advance(ms=1_500)
        assert driver.values("aggregates") == []
        assert [record.key for record in driver.read("items")] == [], "not before WEIR_AGGREGATE_REREQUEST_MS"
        driver.advance(ms=1_000)
        asked = driver.read("items")
        assert sorted(record.key for record in asked) == ["o-1#2@1", "o-1#3@1"]
        [result] = driver.values("aggregates")
        assert result["status"] == "complete"
        assert [item["result"] for item in result["items"]] == [price(index) for index in range(4)]
        assert driver.clock.now_ms() < open_message(driver, 4)["deadline_ms"]


def test_the_count_of_asks_is_bounded_and_the_deadline_still_completes_the_group_partial() -> None:
    """Item 3 is never answered (only the aggregate stage runs here, as if every items worker were stuck): two asks,
    each under a fresh key, then the timeout completes the group partial."""

    class AggregateOnly:
        def __init__(self, wiring: Any) -> None:
            self.pipeline = PipelineTopology(price, wiring)

        def stages(self) -> list[Any]:
            return [self.pipeline.aggregator_stage()]

    with TestDriver(settings=SETTINGS, topologies=[AggregateOnly]) as driver:
        driver.pipe("item-results", open_message(driver, 4), key="o-1")
        for index in (0, 1, 2):
            driver.pipe("item-results", outcome(index, 4), key="o-1")
        driver.advance(seconds=11)
        keys = sorted(record.key for record in driver.read("items"))
        assert keys == ["o-1#3@1", "o-1#3@2"], "two asks (WEIR_AGGREGATE_REREQUESTS), a fresh key each"
        [result] = driver.values("aggregates")
        assert (result["status"], result["missing"]) == ("partial", [3])


def test_without_the_setting_the_open_carries_no_payloads_and_nothing_is_asked_again() -> None:
    settings = Settings(partitions=2, aggregate_timeout_ms=10_000, split_chunk=2)
    with TestDriver(settings=settings, item_step=price) as driver:
        driver.pipe("orders", {"order_id": "o-9", "items": [1, 2, 3, 4, 5]}, key="o-9")
        opens = [record.value for record in driver.read("item-results") if record.value.get("kind") == "open"]
        assert opens
        assert all("items" not in message for message in opens)
        [result] = driver.values("aggregates")
        assert result["status"] == "complete"
    with TestDriver(settings=SETTINGS, item_step=price) as driver:
        driver.pipe("orders", {"order_id": "o-9", "items": [1, 2, 3, 4, 5]}, key="o-9")
        [opened] = [record.value for record in driver.read("item-results") if record.value.get("kind") == "open"]
        assert opened["items"] == [1, 2, 3, 4, 5]
        [result] = driver.values("aggregates")
        assert result["status"] == "complete"
        driver.advance(seconds=5)
        assert [record for record in driver.read("items") if "@" in (record.key or "")] == [], "a whole group asks nothing"


@pytest.mark.parametrize("every", [1, 2, 5])
def test_a_crash_anywhere_gives_the_same_whole_result_once(every: int) -> None:
    with TestDriver(settings=SETTINGS, item_step=price) as driver:
        driver.crash_after(every)
        driver.pipe("item-results", open_message(driver, 4), key="o-1")
        driver.pipe("item-results", outcome(0, 4), key="o-1")
        driver.advance(seconds=3)
        results = driver.values("aggregates")
        assert len(results) == 1
        assert [item["result"] for item in results[0]["items"]] == [price(index) for index in range(4)]


CONFIG = AggregatorConfig(name="agg", timeout_ms=10_000, rerequest_after_ms=2_000, rerequests=2)


@given(st.sets(st.integers(0, 5)), st.integers(0, 12_000))
def test_an_ask_names_exactly_the_missing_items_and_comes_before_any_deadline(received: set[int], at: int) -> None:
    opened = on_open(None, "g", 6, 10_000, 0, config=CONFIG, payloads=list(range(6))).state
    assert isinstance(opened, GroupState)
    state = dataclasses.replace(opened, received={index: _ok(index) for index in received})
    transition = on_expire(state, CONFIG, at)
    due = state.due_ms(CONFIG)
    if due is None or at < due:
        assert transition.state == state
        assert transition.rerequest == ()
    elif due < 10_000:
        assert due == 2_000
        assert transition.rerequest == tuple(index for index in range(6) if index not in received)
        assert isinstance(transition.state, GroupState)
        assert transition.state.rerequested == 1
    else:
        assert transition.rerequest == ()


def _ok(index: int) -> Any:
    from weir.tables.aggregates import ItemOutcome

    return ItemOutcome(index=index, ok=True, result=index, error=None)
