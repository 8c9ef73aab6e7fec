"""The barrier awaiting N executions of a flow (counted by part), handing their results on, and going on at a timeout or a
failure instead of failing (``on_timeout``/``on_failure="continue"``): the core alone, on a fake clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.tables.barrier import (
    COMPLETED,
    CONTINUE,
    FAILED,
    TIMED_OUT,
    BarrierState,
    BarrierTransition,
    Relay,
    Waiting,
    on_arrival,
    on_completion,
    on_forwarded,
    on_relay,
    on_tick,
    release_report,
    reported,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
BARRIER = "await-kitchen"
KEY = "ticket-7"
REMEMBER_MS = 1_000


def waiting(expected: int | None = 3, exchange_id: str = "ex-1", now_ms: int = 0, awaited: tuple[str, ...] = ("kitchen",)) -> Waiting:
    counted = {"kitchen": expected} if expected is not None else {}
    return Waiting(exchange_id, "dispatch", now_ms, now_ms + 100, awaited, {"payload": {"id": KEY}}, 4, expected=counted)


def complete(
    state: BarrierState | None, part: str | None, now_ms: int = 1, outcome: str = COMPLETED, flow: str = "kitchen", **rules: Any
) -> BarrierTransition:
    result = {"flavour": part, "ok": True}
    return on_completion(state, KEY, flow, outcome, None, REMEMBER_MS, BARRIER, now_ms, result=result, part=part, **rules)


def test_a_counted_await_releases_once_every_part_came_each_counted_once() -> None:
    state = on_arrival(None, KEY, waiting(3), BARRIER, 0, on_duplicate="reject").state
    for part in ("mint", "mint", "vanilla"):
        transition = complete(state, part)
        assert not transition.releases, "three distinct parts are awaited, a repeated one counts once"
        state = transition.state
    transition = complete(state, "lemon")
    assert len(transition.releases) == 1
    report = release_report(transition.releases[0])
    assert report["status"] == COMPLETED
    assert [result["flavour"] for result in report["results"]["kitchen"]] == ["lemon", "mint", "vanilla"]
    assert complete(transition.state, "cherry").releases == (), "a release happens once"


def test_parts_that_came_first_are_remembered_and_zero_expected_goes_on_at_once() -> None:
    state = complete(complete(None, "mint").state, "vanilla").state
    transition = on_arrival(state, KEY, waiting(2), BARRIER, 2, on_duplicate="reject")
    assert len(transition.releases) == 1
    none_asked = on_arrival(None, KEY, waiting(0, "ex-2"), BARRIER, 2, on_duplicate="reject")
    assert len(none_asked.releases) == 1
    assert release_report(none_asked.releases[0])["results"] == {}


def test_a_timeout_or_a_failure_goes_on_when_the_barrier_says_continue() -> None:
    state = complete(on_arrival(None, KEY, waiting(2), BARRIER, 0, on_duplicate="reject").state, "mint").state
    failed = on_tick(state, BARRIER, 100)
    assert [failure.reason for failure in failed.failures] == ["timeout"]
    assert not failed.releases
    went_on = on_tick(state, BARRIER, 100, on_timeout=CONTINUE)
    assert not went_on.failures
    report = release_report(went_on.releases[0])
    assert (report["status"], report["missing"]) == (TIMED_OUT, ["kitchen"])
    assert [result["flavour"] for result in report["results"]["kitchen"]] == ["mint"], "what came is handed on"
    assert on_tick(state, BARRIER, 99, on_timeout=CONTINUE).releases == (), "not before its deadline"

    broken = complete(state, "vanilla", outcome=FAILED, on_failure=CONTINUE)
    assert not broken.failures
    assert release_report(broken.releases[0])["status"] == FAILED, "a failed part ends the wait at once"
    assert complete(state, "vanilla", outcome=FAILED).failures[0].reason == "awaited-failed"
    early = complete(None, "vanilla", outcome=FAILED).state
    arrived = on_arrival(early, KEY, waiting(2), BARRIER, 2, on_duplicate="reject", on_failure=CONTINUE)
    assert release_report(arrived.releases[0])["status"] == FAILED


def test_a_plain_await_hands_its_result_on_also_through_a_relay() -> None:
    plain = waiting(None, awaited=("payment",))
    released = complete(on_arrival(None, KEY, plain, BARRIER, 0, on_duplicate="reject").state, None, flow="payment").releases
    assert release_report(released[0])["results"] == {"payment": [{"flavour": None, "ok": True}]}
    exchange = reported(released[0], BARRIER)
    assert exchange["properties"]["barriers"][BARRIER]["status"] == COMPLETED
    assert exchange["payload"] == {"id": KEY}, "the exchange goes on as it arrived, with the report beside it"

    relayed = replace(waiting(None, "ex-9", awaited=("payment",)), relayed={"payment": "pay-1"})
    state = on_arrival(None, KEY, relayed, BARRIER, 0, on_duplicate="reject").state
    at_own_key = on_relay(None, "pay-1", Relay("ex-9", "payment", KEY, 100), 0).state
    forwarded = on_completion(at_own_key, "pay-1", "payment", COMPLETED, None, REMEMBER_MS, BARRIER, 1, result={"paid": 5}).forwards
    assert forwarded[0].result == {"paid": 5}
    last = on_forwarded(state, KEY, "ex-9", "payment", COMPLETED, None, BARRIER, result=forwarded[0].result)
    assert release_report(last.releases[0])["results"] == {"payment": [{"paid": 5}]}


def test_counted_state_reads_back_as_written_and_expires() -> None:
    state = complete(on_arrival(None, KEY, waiting(3), BARRIER, 0, on_duplicate="reject").state, "mint").state
    state = complete(state, "lemon", now_ms=5).state
    assert state is not None
    assert BarrierState.from_dict(state.to_dict()) == state
    remembered = complete(None, "mint", now_ms=1).state
    assert remembered is not None
    assert remembered.next_due_ms() == 1 + REMEMBER_MS
    assert on_tick(remembered, BARRIER, 1 + REMEMBER_MS).state is None, "a remembered part is forgotten in time"


@PROPERTY
@given(
    parts=st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=12),
    expected=st.integers(min_value=0, max_value=4),
    arrival_at=st.integers(min_value=0, max_value=12),
    repeat_arrival=st.booleans(),
)
def test_any_order_and_duplication_releases_once_exactly_when_enough_distinct_parts_came(
    parts: list[str], expected: int, arrival_at: int, repeat_arrival: bool
) -> None:
    events: list[tuple[str, str]] = [("part", part) for part in parts]
    arrival_at = min(arrival_at, len(events))
    events.insert(arrival_at, ("arrival", ""))
    if repeat_arrival:
        events.append(("arrival", ""))
    state: BarrierState | None = None
    releases = []
    for number, (kind, part) in enumerate(events):
        if kind == "arrival":
            transition = on_arrival(state, KEY, waiting(expected), BARRIER, number, on_duplicate="reject")
        else:
            transition = complete(state, part, now_ms=number)
        assert not transition.failures
        releases += transition.releases
        state = transition.state
    if len(set(parts)) >= expected:
        assert len(releases) == 1
        results = release_report(releases[0])["results"].get("kitchen", [])
        assert len(results) == len({result["flavour"] for result in results}), "each part once"
        assert len(results) >= expected
        assert {result["flavour"] for result in results} <= set(parts)
    else:
        assert releases == []
        assert state is not None
        assert [item.exchange_id for item in state.waiting] == ["ex-1"]
