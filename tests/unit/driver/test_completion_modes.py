"""Completion modes of a flow's aggregate on the driver: by period for every open group (Camel's
completionInterval), and a group's timeout read from the exchange that opens it."""

from __future__ import annotations

import pytest

from weir import Flow, FlowDeclarationError, Settings, TestDriver, payload
from weir.app.testing import START_MS

SETTINGS = Settings(partitions=2, tick_interval_ms=100)
PERIOD_MS = 10_000


def test_every_open_group_completes_at_the_end_of_the_period_together() -> None:
    flow = (
        Flow("clicks", source="clicks")
        .aggregate("batch", correlate_by=payload("user"), timeout_ms=None, complete_interval_ms=PERIOD_MS)
        .to("batches")
    )
    with TestDriver([flow], SETTINGS) as driver:
        to_period_end = PERIOD_MS - START_MS % PERIOD_MS
        driver.pipe("clicks", {"user": "a", "n": 1}, key="a")
        driver.advance(ms=to_period_end - 3_000)
        driver.pipe("clicks", {"user": "b", "n": 2}, key="b")
        driver.pipe("clicks", {"user": "a", "n": 3}, key="a")
        assert driver.values("batches") == []
        driver.advance(ms=3_000 + 500)
        results = {result["correlation_id"]: result for result in driver.values("batches")}
    assert set(results) == {"a", "b"}, "both groups, opened 7 s apart, completed at the same period's end"
    assert {(result["status"], result["reason"]) for result in results.values()} == {("complete", "interval")}
    assert [item["result"]["n"] for item in results["a"]["items"]] == [1, 3]
    assert {result["completed_ms"] // PERIOD_MS for result in results.values()} == {(START_MS + to_period_end) // PERIOD_MS}


def test_a_groups_timeout_is_read_from_the_exchange_that_opens_it() -> None:
    flow = (
        Flow("sessions", source="events")
        .aggregate("session", correlate_by=payload("user"), timeout_ms=60_000, timeout_from=payload("ttl_ms"), groups="reopening")
        .to("sessions-out")
    )
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("events", {"user": "a", "ttl_ms": 2_000}, key="a")
        driver.pipe("events", {"user": "b"}, key="b")  # no ttl: the aggregate's 60 s
        driver.advance(ms=2_500)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a"]
        driver.pipe("events", {"user": "a", "ttl_ms": 5_000}, key="a")  # the key's next group, with its own timeout
        driver.advance(ms=4_000)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a"]
        driver.advance(ms=1_500)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a", "a"]
        driver.advance(ms=60_000)
        results = driver.values("sessions-out")
    assert [(result["correlation_id"], result["reason"]) for result in results] == [("a", "timeout"), ("a", "timeout"), ("b", "timeout")]


def test_the_new_knobs_are_checked_where_they_are_declared() -> None:
    with pytest.raises(FlowDeclarationError, match="timeout_from belongs to a group by key"):
        Flow("f", source="in").split("s", payload("items")).aggregate("a", timeout_ms=None, timeout_from=payload("t"))
    with pytest.raises(FlowDeclarationError, match="complete_interval_ms must be a positive integer"):
        Flow("g", source="in").aggregate("a", correlate_by=payload("k"), timeout_ms=None, complete_interval_ms=-5)
