"""A window as a flow step on the driver: exchanges folded per key into windows of event time, each window's result a
new execution of the flow from the next step; late exchanges dead-lettered; exactly once across a crash."""

from __future__ import annotations

from typing import Any

import pytest

from weir import Exchange, Flow, FlowDeclarationError, SessionSpec, Settings, TestDriver, WindowSpec, payload

ONE_PARTITION = Settings(partitions=1)


def _labelled(exchange: Exchange) -> dict[str, Any]:
    result = exchange.payload
    return {"user": exchange.key, "second": result["start_ms"] // 1_000, "clicks": result["value"], "final": result["final"]}


def clicks_flow(**window: Any) -> Flow:
    options: dict[str, Any] = {"key": payload("user")} | window
    return (
        Flow("clicks", source="clicks")
        .window("per-second", WindowSpec.tumbling(1_000, grace_ms=200), **options)
        .process("label", _labelled)
        .to("click-counts")
    )


def _pipe(driver: TestDriver, rows: list[tuple[str, int]]) -> None:
    for user, stamp in rows:
        driver.pipe("clicks", {"user": user, "page": "/"}, key=user, timestamp_ms=stamp)


ROWS = [("a", 100), ("a", 300), ("b", 500), ("a", 1_100), ("b", 1_150), ("a", 1_300), ("b", 2_900)]


def test_each_window_s_result_runs_the_rest_of_the_flow_once_when_it_closes() -> None:
    with TestDriver([clicks_flow()], ONE_PARTITION) as driver:
        _pipe(driver, ROWS[:5])
        assert driver.values("click-counts") == [], "second 0 closes at stream time 1,200"
        _pipe(driver, ROWS[5:])
        counts = driver.values("click-counts")
    assert counts == [
        {"user": "a", "second": 0, "clicks": 2, "final": True},
        {"user": "b", "second": 0, "clicks": 1, "final": True},
        {"user": "a", "second": 1, "clicks": 2, "final": True},
        {"user": "b", "second": 1, "clicks": 1, "final": True},
    ]


def test_the_event_time_may_come_from_the_payload_and_the_fold_from_the_user() -> None:
    flow = (
        Flow("spend", source="payments")
        .window(
            "per-minute",
            WindowSpec.tumbling(60_000),
            key=payload("card"),
            timestamp=payload("at"),
            initial=0,
            fold=lambda total, paid: total + paid["cents"],
        )
        .to("spend-per-minute")
    )
    with TestDriver([flow], ONE_PARTITION) as driver:
        for card, at, cents in [("c1", 1_000, 250), ("c1", 59_000, 300), ("c2", 30_000, 100), ("c1", 61_000, 5)]:
            driver.pipe("payments", {"card": card, "at": at, "cents": cents}, key=card)  # the records' own timestamps: the clock's
        results = driver.values("spend-per-minute")
    assert [(result["key"], result["start_ms"], result["value"]) for result in results] == [("c1", 0, 550), ("c2", 0, 100)]


def test_an_exchange_later_than_its_window_s_close_is_dead_lettered_and_its_execution_ended() -> None:
    with TestDriver([clicks_flow()], ONE_PARTITION) as driver:
        _pipe(driver, [("a", 100), ("a", 1_500), ("a", 200)])  # 200 comes after stream time 1,500 closed second 0
        [late] = driver.dead_letters()
        counts = driver.values("click-counts")
        outcomes = driver.values("flow.clicks.outcomes")
    assert late["reason"] == "late"
    assert counts == [{"user": "a", "second": 0, "clicks": 1, "final": True}]
    ended = sorted(outcome["exchange_id"] for outcome in outcomes if outcome["outcome"] == "completed")
    assert len(ended) == 3 + 1, f"3 exchanges in, each ended at the window, and 1 window result's execution: {ended}"
    assert "clicks:per-second:a@0" in ended


def test_updates_run_the_flow_on_every_exchange_and_once_more_at_the_close() -> None:
    with TestDriver([clicks_flow(emit="update")], ONE_PARTITION) as driver:
        _pipe(driver, [("a", 100), ("a", 300), ("a", 1_300)])
        counts = driver.values("click-counts")
    assert [(count["second"], count["clicks"], count["final"]) for count in counts] == [
        (0, 1, False),
        (0, 2, False),
        (1, 1, False),
        (0, 2, True),
    ]


def test_sessions_as_a_step() -> None:
    flow = Flow("visits", source="clicks").window("visit", SessionSpec(gap_ms=1_000), key=payload("user")).to("visits")
    with TestDriver([flow], ONE_PARTITION) as driver:
        _pipe(driver, [("a", 0), ("a", 800), ("a", 1_500), ("a", 5_000)])
        visits = driver.values("visits")
    assert [(visit["start_ms"], visit["end_ms"], visit["value"]) for visit in visits] == [(0, 1_500, 3)]


def test_a_crash_at_any_event_sends_each_window_s_result_through_the_flow_once() -> None:
    with TestDriver([clicks_flow()], ONE_PARTITION) as reference:
        _pipe(reference, ROWS)
        expected = reference.values("click-counts")
        handled = reference.events_handled
    for crash_at in range(1, handled):
        with TestDriver([clicks_flow()], ONE_PARTITION) as driver:
            driver.crash_after(crash_at)
            _pipe(driver, ROWS)
            driver.run()
            assert driver.crashes == 1
            assert driver.values("click-counts") == expected, f"a crash after {crash_at} events"


def test_a_window_is_refused_between_a_split_and_its_aggregate_and_with_a_bad_emit() -> None:
    with pytest.raises(FlowDeclarationError, match="only process steps"):
        Flow("f", source="in").split("s", payload("items")).window("w", WindowSpec.tumbling(1_000))
    with pytest.raises(FlowDeclarationError, match="emit is 'final' or 'update'"):
        Flow("g", source="in").window("w", WindowSpec.tumbling(1_000), emit="sometimes")
