"""Unit and property tests for the pure cross-flow barrier state core in ``tables/barrier.py``.

Time is a fake clock (plain ints); nothing here sleeps or touches Kafka/Faust.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.tables.barrier import (
    COMPLETED,
    DUPLICATE_RULES,
    FAILED,
    REJECT,
    RELEASE_ALL,
    REPLACE,
    BarrierState,
    BarrierTransition,
    Failure,
    FlowCompletion,
    OnDuplicate,
    Release,
    Waiting,
    on_arrival,
    on_completion,
    on_tick,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=200, deadline=None, database=None)

BARRIER = "await-kitchen-and-payment"
KEY = "order-42"
FLOWS = ("queue://kitchen", "queue://payment", "queue://stock", "queue://fraud")
NOISE = ("queue://unrelated", "queue://other")
TIMEOUT_MS = 1_800_000
REMEMBER_MS = 1_800_000


def exchange_snapshot(exchange_id: str = "ex-1") -> dict[str, Any]:
    return {
        "id": exchange_id,
        "payload": {"orderId": KEY, "lines": [1, 2, 3]},
        "headers": {"order-id": KEY},
        "properties": {"validated": True, "nested": {"a": [{"b": None}]}},
    }


def waiting_for(
    awaited: tuple[str, ...],
    now_ms: int,
    exchange_id: str = "ex-1",
    timeout_ms: int = TIMEOUT_MS,
    resume_step: int = 3,
) -> Waiting:
    return Waiting(
        exchange_id=exchange_id,
        flow="dispatch",
        arrived_ms=now_ms,
        deadline_ms=now_ms + timeout_ms,
        awaited=awaited,
        exchange=exchange_snapshot(exchange_id),
        resume_step=resume_step,
    )


@dataclass
class Barrier:
    """Drives the core the way a barrier agent would, for one key, with a fake clock."""

    key: str = KEY
    name: str = BARRIER
    now: int = 1_000
    remember_ms: int = REMEMBER_MS
    on_duplicate: OnDuplicate = REJECT
    state: BarrierState | None = None
    releases: list[Release] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def _apply(self, transition: BarrierTransition) -> BarrierTransition:
        self.state = transition.state
        self.releases.extend(transition.releases)
        self.failures.extend(transition.failures)
        return transition

    def arrive(self, waiting: Waiting) -> BarrierTransition:
        return self._apply(on_arrival(self.state, self.key, waiting, self.name, self.now, on_duplicate=self.on_duplicate))

    def complete(self, flow: str, outcome: str = COMPLETED, error: str | None = None) -> BarrierTransition:
        return self._apply(on_completion(self.state, self.key, flow, outcome, error, self.remember_ms, self.name, self.now))

    def tick(self) -> BarrierTransition:
        return self._apply(on_tick(self.state, self.name, self.now))


# --------------------------------------------------------------------------------------------------------------
# Main property: any interleaving of arrival and (duplicated) completions releases exactly once.
# --------------------------------------------------------------------------------------------------------------

ARRIVE = "<arrive>"
TICK = "<tick>"


@st.composite
def release_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    awaited = tuple(draw(st.lists(st.sampled_from(FLOWS), min_size=1, max_size=4, unique=True)))
    events: list[str] = []
    for flow in awaited:
        events += [flow] * draw(st.integers(min_value=1, max_value=3))
    events += draw(st.lists(st.sampled_from(NOISE), max_size=3))
    events += [TICK] * draw(st.integers(min_value=0, max_value=3))
    events = list(draw(st.permutations(events)))
    events.insert(draw(st.integers(min_value=0, max_value=len(events))), ARRIVE)
    gaps = draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=len(events), max_size=len(events)))
    resume_step = draw(st.integers(min_value=0, max_value=20))
    return {"awaited": awaited, "events": events, "gaps": gaps, "resume_step": resume_step}


@PROPERTY
@given(release_scenarios())
def test_any_interleaving_releases_exactly_once_with_everything_satisfied(scenario: dict[str, Any]) -> None:
    awaited: tuple[str, ...] = scenario["awaited"]
    events: list[str] = scenario["events"]
    barrier = Barrier()
    waiting: Waiting | None = None
    original_exchange: dict[str, Any] | None = None
    # The release must happen at the event that brings the last of: the arrival, the first completion of each awaited flow.
    firsts = {flow: events.index(flow) for flow in awaited}
    expected_release_at = max([events.index(ARRIVE), *firsts.values()])

    for position, (event, gap) in enumerate(zip(events, scenario["gaps"], strict=True)):
        barrier.now += gap
        if waiting is not None:
            assert barrier.now < waiting.deadline_ms  # the scenario stays within the deadline
        if event == ARRIVE:
            waiting = waiting_for(awaited, barrier.now, resume_step=scenario["resume_step"])
            original_exchange = copy.deepcopy(waiting.exchange)
            transition = barrier.arrive(waiting)
        elif event == TICK:
            transition = barrier.tick()
        else:
            transition = barrier.complete(event)
        assert transition.failures == ()
        assert len(transition.releases) == (1 if position == expected_release_at else 0)

    assert waiting is not None
    assert original_exchange is not None
    assert barrier.failures == []
    assert len(barrier.releases) == 1
    released = barrier.releases[0].waiting
    assert released.exchange_id == waiting.exchange_id
    assert sorted(released.satisfied) == sorted(awaited)
    assert released.missing == ()
    assert released.awaited == awaited
    assert released.exchange == original_exchange
    assert released.resume_step == scenario["resume_step"]
    assert (released.flow, released.arrived_ms, released.deadline_ms) == (waiting.flow, waiting.arrived_ms, waiting.deadline_ms)
    assert barrier.state is not None
    assert barrier.state.waiting == ()

    # A redelivered arrival, and further completions, release nothing more.
    before = barrier.state
    redelivered = barrier.arrive(waiting)
    assert redelivered.releases == ()
    assert redelivered.failures == ()
    assert redelivered.state == before
    for flow in awaited:
        assert barrier.complete(flow).releases == ()
    assert len(barrier.releases) == 1
    assert barrier.failures == []


# --------------------------------------------------------------------------------------------------------------
# Failure property: a definitive failure of an awaited flow fails the exchange exactly once.
# --------------------------------------------------------------------------------------------------------------


@st.composite
def failure_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    awaited = tuple(draw(st.lists(st.sampled_from(FLOWS), min_size=1, max_size=4, unique=True)))
    failing = draw(st.lists(st.sampled_from(awaited), min_size=1, max_size=len(awaited), unique=True))
    events: list[tuple[str, str]] = []
    for flow in awaited:
        if flow in failing:
            events += [(flow, FAILED)] * draw(st.integers(min_value=1, max_value=2))
        else:
            events += [(flow, COMPLETED)] * draw(st.integers(min_value=0, max_value=3))
    events += [(flow, COMPLETED) for flow in draw(st.lists(st.sampled_from(NOISE), max_size=2))]
    events += [(TICK, "")] * draw(st.integers(min_value=0, max_value=2))
    events = list(draw(st.permutations(events)))
    events.insert(draw(st.integers(min_value=0, max_value=len(events))), (ARRIVE, ""))
    gaps = draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=len(events), max_size=len(events)))
    return {"awaited": awaited, "failing": failing, "events": events, "gaps": gaps}


@PROPERTY
@given(failure_scenarios())
def test_a_failed_awaited_flow_fails_the_exchange_exactly_once(scenario: dict[str, Any]) -> None:
    awaited: tuple[str, ...] = scenario["awaited"]
    events: list[tuple[str, str]] = scenario["events"]
    arrival = events.index((ARRIVE, ""))
    failed_before = [flow for flow in awaited if (flow, FAILED) in events[:arrival]]
    if failed_before:
        expected_at, expected_flow = arrival, failed_before[0]  # checked in awaited order at arrival
    else:
        expected_at = next(i for i, (flow, outcome) in enumerate(events) if i > arrival and outcome == FAILED)
        expected_flow = events[expected_at][0]

    barrier = Barrier()
    waiting: Waiting | None = None
    for position, ((event, outcome), gap) in enumerate(zip(events, scenario["gaps"], strict=True)):
        barrier.now += gap
        if event == ARRIVE:
            waiting = waiting_for(awaited, barrier.now)
            transition = barrier.arrive(waiting)
        elif event == TICK:
            transition = barrier.tick()
        else:
            transition = barrier.complete(event, outcome, f"RuntimeError: {event} broke" if outcome == FAILED else None)
        assert transition.releases == ()
        assert len(transition.failures) == (1 if position == expected_at else 0)

    assert waiting is not None
    assert barrier.releases == []
    assert len(barrier.failures) == 1
    failure = barrier.failures[0]
    assert failure.reason == "awaited-failed"
    assert failure.missing == (expected_flow,)
    assert failure.waiting.exchange_id == waiting.exchange_id
    assert failure.waiting.exchange == exchange_snapshot()
    assert repr(BARRIER) in failure.error
    assert repr(expected_flow) in failure.error
    assert repr(KEY) in failure.error
    assert f"RuntimeError: {expected_flow} broke" in failure.error

    # Whatever happens next (all flows complete, the arrival is redelivered), it is never released nor failed again.
    for flow in awaited:
        barrier.complete(flow)
    barrier.arrive(waiting)
    barrier.now = waiting.deadline_ms - 1
    barrier.tick()
    assert barrier.releases == []
    assert len(barrier.failures) == 1


def test_failure_of_a_flow_already_satisfied_does_not_fail_the_exchange() -> None:
    barrier = Barrier()
    barrier.arrive(waiting_for(("queue://kitchen", "queue://payment"), barrier.now))
    barrier.complete("queue://kitchen")
    barrier.now += 10
    assert barrier.complete("queue://kitchen", FAILED, "boom").failures == ()
    barrier.now += 10
    assert len(barrier.complete("queue://payment").releases) == 1
    assert barrier.failures == []


# --------------------------------------------------------------------------------------------------------------
# Remembered completions.
# --------------------------------------------------------------------------------------------------------------


def test_completions_remembered_before_arrival_release_at_once() -> None:
    barrier = Barrier()
    barrier.complete("queue://kitchen")
    barrier.now += 500
    barrier.complete("queue://payment")
    barrier.now += 500
    waiting = waiting_for(("queue://kitchen", "queue://payment"), barrier.now)
    transition = barrier.arrive(waiting)
    assert transition.failures == ()
    assert len(transition.releases) == 1
    assert transition.releases[0].waiting.satisfied == ("queue://kitchen", "queue://payment")
    assert transition.releases[0].waiting.exchange == exchange_snapshot()
    assert transition.state is not None
    assert transition.state.waiting == ()
    # settled for another timeout past the deadline, so a redelivered arrival stays ignored
    assert transition.state.settled == {"ex-1": waiting.deadline_ms + (waiting.deadline_ms - waiting.arrived_ms)}
    # the completions stay remembered for other exchanges on the same key
    assert set(transition.state.completions) == {"queue://kitchen", "queue://payment"}


@pytest.mark.parametrize(("age_ms", "counts"), [(999, True), (1_000, False), (5_000, False)])
def test_a_remembered_completion_counts_only_until_it_expires(age_ms: int, counts: bool) -> None:
    barrier = Barrier(remember_ms=1_000)
    barrier.complete("queue://kitchen")
    assert barrier.state is not None
    assert barrier.state.completions["queue://kitchen"].expires_ms == barrier.now + 1_000
    barrier.now += age_ms
    transition = barrier.arrive(waiting_for(("queue://kitchen",), barrier.now))
    assert len(transition.releases) == (1 if counts else 0)
    assert transition.failures == ()
    if not counts:
        assert transition.state is not None
        assert [item.missing for item in transition.state.waiting] == [("queue://kitchen",)]


def test_an_expired_failure_does_not_fail_the_arrival() -> None:
    barrier = Barrier(remember_ms=1_000)
    barrier.complete("queue://kitchen", FAILED, "boom")
    barrier.now += 1_000
    transition = barrier.arrive(waiting_for(("queue://kitchen",), barrier.now))
    assert transition.failures == ()
    assert transition.releases == ()
    barrier.now += 1
    assert len(barrier.complete("queue://kitchen").releases) == 1


def test_only_the_latest_outcome_of_a_flow_is_remembered() -> None:
    barrier = Barrier()
    barrier.complete("queue://kitchen", FAILED, "boom")
    barrier.now += 1
    barrier.complete("queue://kitchen")
    barrier.now += 1
    assert len(barrier.arrive(waiting_for(("queue://kitchen",), barrier.now)).releases) == 1
    assert barrier.failures == []


def test_completion_of_a_flow_not_awaited_counts_for_nothing() -> None:
    barrier = Barrier()
    barrier.complete("queue://stock")
    transition = barrier.arrive(waiting_for(("queue://kitchen",), barrier.now))
    assert transition.releases == ()
    assert barrier.complete("queue://stock").releases == ()
    assert barrier.state is not None
    assert [item.missing for item in barrier.state.waiting] == [("queue://kitchen",)]


def test_a_redelivered_arrival_while_waiting_is_counted_once() -> None:
    barrier = Barrier()
    waiting = waiting_for(("queue://kitchen", "queue://payment"), barrier.now)
    barrier.arrive(waiting)
    barrier.complete("queue://kitchen")
    before = barrier.state
    transition = barrier.arrive(waiting)
    assert transition.state is before
    assert (transition.releases, transition.failures) == ((), ())
    assert before is not None
    assert len(before.waiting) == 1
    assert before.waiting[0].satisfied == ("queue://kitchen",)
    assert len(barrier.complete("queue://payment").releases) == 1
    assert len(barrier.releases) == 1


def test_a_redelivered_arrival_after_an_awaited_failure_is_ignored() -> None:
    barrier = Barrier()
    waiting = waiting_for(("queue://kitchen",), barrier.now)
    barrier.arrive(waiting)
    barrier.complete("queue://kitchen", FAILED, "boom")
    assert len(barrier.failures) == 1
    barrier.complete("queue://kitchen")  # a later good execution is remembered
    transition = barrier.arrive(waiting)
    assert (transition.releases, transition.failures) == ((), ())
    assert barrier.releases == []


# --------------------------------------------------------------------------------------------------------------
# Timeout.
# --------------------------------------------------------------------------------------------------------------


def test_timeout_fails_with_the_flows_still_missing_and_late_completions_release_nothing() -> None:
    barrier = Barrier()
    awaited = ("queue://kitchen", "queue://payment", "queue://stock")
    waiting = waiting_for(awaited, barrier.now, exchange_id="ex-7", timeout_ms=60_000)
    barrier.arrive(waiting)
    barrier.now += 10
    barrier.complete("queue://payment")

    barrier.now = waiting.deadline_ms - 1
    transition = barrier.tick()
    assert (transition.releases, transition.failures) == ((), ())
    assert transition.state is not None
    assert len(transition.state.waiting) == 1

    barrier.now = waiting.deadline_ms
    transition = barrier.tick()
    assert transition.releases == ()
    assert len(transition.failures) == 1
    failure = transition.failures[0]
    assert failure.reason == "timeout"
    assert failure.missing == ("queue://kitchen", "queue://stock")
    assert failure.waiting.exchange_id == "ex-7"
    assert failure.waiting.exchange == exchange_snapshot("ex-7")
    for expected in (repr(BARRIER), repr("queue://kitchen"), repr("queue://stock"), repr(KEY), repr("ex-7")):
        assert expected in failure.error
    assert repr("queue://payment") not in failure.error
    assert transition.state is not None
    assert transition.state.waiting == ()

    # late completions release nothing, but are remembered for later arrivals
    barrier.now += 5
    assert barrier.complete("queue://kitchen").releases == ()
    assert barrier.complete("queue://stock").releases == ()
    assert barrier.state is not None
    assert set(barrier.state.completions) == {"queue://kitchen", "queue://payment", "queue://stock"}
    assert barrier.state.completions["queue://stock"].at_ms == barrier.now
    assert barrier.releases == []
    assert len(barrier.failures) == 1
    # a new exchange on the same key uses them
    assert len(barrier.arrive(waiting_for(awaited, barrier.now, exchange_id="ex-8")).releases) == 1


def test_a_redelivered_arrival_after_the_timeout_is_not_released() -> None:
    barrier = Barrier()
    waiting = waiting_for(("queue://kitchen",), barrier.now, timeout_ms=60_000)
    barrier.arrive(waiting)
    barrier.now = waiting.deadline_ms
    assert [failure.reason for failure in barrier.tick().failures] == ["timeout"]
    barrier.now += 1
    assert barrier.complete("queue://kitchen").releases == ()  # late completion: remembered, releases nothing
    barrier.now += 1
    transition = barrier.arrive(waiting)  # the same arrival, redelivered
    assert transition.releases == ()
    assert transition.failures == ()
    assert barrier.releases == []


@PROPERTY
@given(
    st.lists(st.sampled_from(FLOWS), min_size=1, max_size=4, unique=True),
    st.data(),
    st.integers(min_value=0, max_value=100_000),
)
def test_timeout_reports_exactly_the_flows_not_yet_completed(awaited: list[str], data: st.DataObject, late_ms: int) -> None:
    done = data.draw(st.lists(st.sampled_from(awaited), max_size=len(awaited) - 1, unique=True))
    barrier = Barrier()
    waiting = waiting_for(tuple(awaited), barrier.now, timeout_ms=60_000)
    barrier.arrive(waiting)
    for flow in done:
        barrier.now += 100
        barrier.complete(flow)
    barrier.now = waiting.deadline_ms + late_ms
    transition = barrier.tick()
    assert len(transition.failures) == 1
    assert transition.failures[0].reason == "timeout"
    assert transition.failures[0].missing == tuple(flow for flow in awaited if flow not in done)
    assert transition.releases == ()


# --------------------------------------------------------------------------------------------------------------
# Several exchanges waiting on one key.
# --------------------------------------------------------------------------------------------------------------


def test_several_exchanges_on_one_key_are_released_independently_under_release_all() -> None:
    barrier = Barrier(on_duplicate=RELEASE_ALL)
    barrier.arrive(waiting_for(("queue://kitchen", "queue://payment"), barrier.now, exchange_id="a", resume_step=1))
    barrier.now += 1
    barrier.arrive(waiting_for(("queue://payment", "queue://stock"), barrier.now, exchange_id="b", resume_step=2))
    barrier.now += 1
    barrier.arrive(waiting_for(("queue://kitchen",), barrier.now, exchange_id="c", resume_step=3))
    barrier.now += 1
    barrier.arrive(waiting_for(("queue://fraud",), barrier.now, exchange_id="d", resume_step=4))
    assert barrier.state is not None
    assert [item.exchange_id for item in barrier.state.waiting] == ["a", "b", "c", "d"]

    barrier.now += 1
    transition = barrier.complete("queue://kitchen")
    assert [release.waiting.exchange_id for release in transition.releases] == ["c"]
    assert transition.releases[0].waiting.resume_step == 3

    barrier.now += 1
    transition = barrier.complete("queue://payment")
    assert [release.waiting.exchange_id for release in transition.releases] == ["a"]
    assert sorted(transition.releases[0].waiting.satisfied) == ["queue://kitchen", "queue://payment"]
    assert transition.releases[0].waiting.exchange == exchange_snapshot("a")
    assert transition.state is not None
    assert {item.exchange_id: item.satisfied for item in transition.state.waiting} == {"b": ("queue://payment",), "d": ()}

    barrier.now += 1
    transition = barrier.complete("queue://fraud", FAILED, "fraud suspected")
    assert transition.releases == ()
    assert [failure.waiting.exchange_id for failure in transition.failures] == ["d"]

    barrier.now += 1
    transition = barrier.complete("queue://stock")
    assert [release.waiting.exchange_id for release in transition.releases] == ["b"]
    assert transition.releases[0].waiting.resume_step == 2
    assert transition.state is not None
    assert transition.state.waiting == ()
    assert set(transition.state.settled) == {"a", "b", "c", "d"}
    assert len(barrier.releases) == 3
    assert len(barrier.failures) == 1


def test_one_completion_releases_every_exchange_it_completes_at_once_under_release_all() -> None:
    barrier = Barrier(on_duplicate=RELEASE_ALL)
    for exchange_id in ("x", "y", "z"):
        barrier.arrive(waiting_for(("queue://kitchen",), barrier.now, exchange_id=exchange_id))
    transition = barrier.complete("queue://kitchen")
    assert [release.waiting.exchange_id for release in transition.releases] == ["x", "y", "z"]
    assert transition.state is not None
    assert transition.state.waiting == ()


# --------------------------------------------------------------------------------------------------------------
# A second waiter on a key where one already waits: the barrier's on_duplicate rule.
# --------------------------------------------------------------------------------------------------------------

BOTH = ("queue://kitchen", "queue://payment")


def test_reject_dead_letters_the_second_waiter_and_leaves_the_first_as_it_was() -> None:
    barrier = Barrier()  # on_duplicate defaults to 'reject'
    barrier.arrive(waiting_for(BOTH, barrier.now, exchange_id="first"))
    barrier.complete("queue://kitchen")
    before = barrier.state
    assert before is not None
    barrier.now += 10
    second = waiting_for(BOTH, barrier.now, exchange_id="second")
    transition = barrier.arrive(second)
    assert transition.releases == ()
    [failure] = transition.failures
    assert (failure.reason, failure.waiting, failure.missing) == ("duplicate-waiter", second, ())
    for expected in (repr(BARRIER), repr("second"), repr("first"), repr(KEY), "on_duplicate='reject'"):
        assert expected in failure.error
    assert transition.state is not None
    assert transition.state.waiting == before.waiting, "the first waits on, unchanged"
    assert set(transition.state.settled) == {"second"}

    barrier.now += 10
    transition = barrier.complete("queue://payment")
    assert [release.waiting.exchange_id for release in transition.releases] == ["first"]
    assert transition.releases[0].waiting.exchange == exchange_snapshot("first")
    assert len(barrier.failures) == 1


def test_a_redelivered_arrival_is_never_a_second_waiter() -> None:
    barrier = Barrier()
    first = waiting_for(BOTH, barrier.now, exchange_id="first")
    barrier.arrive(first)
    barrier.now += 10
    # The same exchange, redelivered (same exchange id, a later arrival time): not a duplicate waiter.
    transition = barrier.arrive(replace(first, arrived_ms=barrier.now))
    assert transition == BarrierTransition(state=barrier.state)
    second = waiting_for(BOTH, barrier.now, exchange_id="second")
    assert [failure.reason for failure in barrier.arrive(second).failures] == ["duplicate-waiter"]
    # The refused one, redelivered: refused once only.
    before = barrier.state
    assert barrier.arrive(second) == BarrierTransition(state=before)
    assert len(barrier.failures) == 1


def test_release_all_lets_both_wait_and_releases_them_together() -> None:
    barrier = Barrier(on_duplicate=RELEASE_ALL)
    barrier.arrive(waiting_for(BOTH, barrier.now, exchange_id="first"))
    barrier.now += 10
    assert barrier.arrive(waiting_for(BOTH, barrier.now, exchange_id="second")).failures == ()
    barrier.complete("queue://kitchen")
    transition = barrier.complete("queue://payment")
    assert [release.waiting.exchange_id for release in transition.releases] == ["first", "second"]
    assert barrier.failures == []


def test_replace_supersedes_the_one_waiting_and_the_newcomer_waits_in_its_place() -> None:
    barrier = Barrier(on_duplicate=REPLACE)
    older = waiting_for(BOTH, barrier.now, exchange_id="older")
    barrier.arrive(older)
    barrier.complete("queue://kitchen")
    barrier.now += 10
    transition = barrier.arrive(waiting_for(BOTH, barrier.now, exchange_id="newer"))
    assert transition.releases == ()
    [failure] = transition.failures
    assert (failure.reason, failure.waiting.exchange_id, failure.missing) == ("superseded", "older", ("queue://payment",))
    for expected in (repr(BARRIER), repr("older"), repr("newer"), repr(KEY), "on_duplicate='replace'"):
        assert expected in failure.error
    assert transition.state is not None
    [newer] = transition.state.waiting
    assert (newer.exchange_id, newer.satisfied) == ("newer", ("queue://kitchen",)), "remembered completions count for it"
    assert barrier.arrive(older) == BarrierTransition(state=barrier.state), "the superseded one, redelivered, is ignored"
    barrier.now += 10
    assert [release.waiting.exchange_id for release in barrier.complete("queue://payment").releases] == ["newer"]
    assert len(barrier.failures) == 1


@pytest.mark.parametrize("rule", DUPLICATE_RULES)
def test_once_the_waiter_went_on_the_next_exchange_on_the_key_is_no_duplicate(rule: OnDuplicate) -> None:
    barrier = Barrier(on_duplicate=rule)
    barrier.arrive(waiting_for(("queue://kitchen",), barrier.now, exchange_id="first"))
    barrier.complete("queue://kitchen")
    barrier.now += 10
    transition = barrier.arrive(waiting_for(("queue://kitchen",), barrier.now, exchange_id="next"))
    assert [release.waiting.exchange_id for release in transition.releases] == ["next"], "released by the remembered completion"
    assert barrier.failures == []


def test_an_unknown_rule_is_refused_naming_the_barrier_and_the_rules() -> None:
    with pytest.raises(ValueError, match=r"barrier 'await-kitchen-and-payment': on_duplicate must be one of \['reject', 'release-all'"):
        on_arrival(None, KEY, waiting_for(BOTH, 0), BARRIER, 0, on_duplicate="sometimes")  # type: ignore[arg-type]


def expected_outputs(rule: OnDuplicate, awaited: tuple[str, ...], events: list[str]) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """What each event must do under ``rule``, by a plain model: (ids released, (reason, id) given up)."""
    completed: set[str] = set()
    waiting: list[str] = []
    seen: set[str] = set()
    outputs: list[tuple[list[str], list[tuple[str, str]]]] = []
    for event in events:
        released: list[str] = []
        given_up: list[tuple[str, str]] = []
        if event.startswith("ex-") and event not in seen:
            seen.add(event)
            if waiting and rule == REJECT:
                given_up.append(("duplicate-waiter", event))
            else:
                if waiting and rule == REPLACE:
                    given_up += [("superseded", older) for older in waiting]
                    waiting = []
                waiting.append(event)
        elif event in awaited:
            completed.add(event)
        if set(awaited) <= completed:
            released, waiting = waiting, []
        outputs.append((released, given_up))
    return outputs


@st.composite
def duplicate_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    awaited = tuple(draw(st.lists(st.sampled_from(FLOWS), min_size=1, max_size=3, unique=True)))
    exchanges = [f"ex-{number}" for number in range(draw(st.integers(min_value=1, max_value=4)))]
    events: list[str] = []
    for exchange_id in exchanges:
        events += [exchange_id] * draw(st.integers(min_value=1, max_value=3))  # copies after the first are redeliveries
    for flow in awaited:
        events += [flow] * draw(st.integers(min_value=0, max_value=2))
    events += draw(st.lists(st.sampled_from(NOISE), max_size=2))
    events += [TICK] * draw(st.integers(min_value=0, max_value=2))
    events = list(draw(st.permutations(events)))
    gaps = draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=len(events), max_size=len(events)))
    return {"rule": draw(st.sampled_from(DUPLICATE_RULES)), "awaited": awaited, "events": events, "gaps": gaps}


@PROPERTY
@given(duplicate_scenarios())
def test_any_interleaving_of_waiters_redeliveries_and_completions_follows_the_rule(scenario: dict[str, Any]) -> None:
    rule: OnDuplicate = scenario["rule"]
    awaited: tuple[str, ...] = scenario["awaited"]
    events: list[str] = scenario["events"]
    barrier = Barrier(on_duplicate=rule)
    first_arrival: dict[str, Waiting] = {}
    for event, gap, (released, given_up) in zip(events, scenario["gaps"], expected_outputs(rule, awaited, events), strict=True):
        barrier.now += gap
        before = barrier.state
        if event == TICK:
            transition = barrier.tick()
        elif event.startswith("ex-"):
            waiting = waiting_for(awaited, barrier.now, exchange_id=event)
            transition = barrier.arrive(waiting)
            if event in first_arrival:
                assert transition == BarrierTransition(state=before), "a redelivered arrival changes nothing"
            first_arrival.setdefault(event, waiting)
        else:
            transition = barrier.complete(event)
        assert [release.waiting.exchange_id for release in transition.releases] == released
        assert [(failure.reason, failure.waiting.exchange_id) for failure in transition.failures] == given_up
        for outcome in (*transition.releases, *transition.failures):
            assert outcome.waiting.exchange == first_arrival[outcome.waiting.exchange_id].exchange, "as it arrived the first time"
        if rule != RELEASE_ALL and barrier.state is not None:
            assert len(barrier.state.waiting) <= 1, "one waiter per key"

    # Every exchange ends up in exactly one place: released, given up, or still waiting.
    settled = [outcome.waiting.exchange_id for outcome in (*barrier.releases, *barrier.failures)]
    still_waiting = [item.exchange_id for item in barrier.state.waiting] if barrier.state is not None else []
    assert sorted(settled + still_waiting) == sorted(first_arrival)


# --------------------------------------------------------------------------------------------------------------
# on_tick housekeeping and next_due_ms.
# --------------------------------------------------------------------------------------------------------------


def test_on_tick_forgets_expired_completions_and_settled_ids_then_state_is_none() -> None:
    assert on_tick(None, BARRIER, 123) == BarrierTransition(state=None)
    barrier = Barrier(remember_ms=500)
    waiting = waiting_for(("queue://kitchen",), barrier.now, timeout_ms=2_000)
    barrier.arrive(waiting)
    barrier.complete("queue://kitchen")  # released; settled until deadline + timeout (5000)
    barrier.complete("queue://payment")  # remembered until 1500
    state = barrier.state
    assert state is not None
    assert state.settled == {"ex-1": 5_000}
    assert {flow: completion.expires_ms for flow, completion in state.completions.items()} == {
        "queue://kitchen": 1_500,
        "queue://payment": 1_500,
    }
    assert state.next_due_ms() == 1_500

    barrier.now = 1_499
    transition = barrier.tick()
    assert transition.state == state
    barrier.now = 1_500
    transition = barrier.tick()
    assert transition.state is not None
    assert transition.state.completions == {}
    assert transition.state.settled == {"ex-1": 5_000}
    assert transition.state.next_due_ms() == 5_000
    barrier.now = 4_999
    assert barrier.tick().state is not None
    # until then a redelivered arrival is still ignored
    assert barrier.arrive(waiting) == BarrierTransition(state=barrier.state)
    barrier.now = 5_000
    transition = barrier.tick()
    assert transition == BarrierTransition(state=None)


def test_next_due_ms_is_the_earliest_deadline_expiry_or_settled_until() -> None:
    assert BarrierState(key=KEY).next_due_ms() is None
    completion = FlowCompletion(flow="queue://kitchen", outcome=COMPLETED, at_ms=0, expires_ms=700)
    waiting_a = waiting_for(("queue://kitchen",), 0, exchange_id="a", timeout_ms=900)
    waiting_b = waiting_for(("queue://payment",), 0, exchange_id="b", timeout_ms=400)
    state = BarrierState(key=KEY, waiting=(waiting_a, waiting_b), completions={"queue://kitchen": completion}, settled={"z": 650})
    assert state.next_due_ms() == 400
    assert BarrierState(key=KEY, waiting=(waiting_a,), completions={"queue://kitchen": completion}, settled={"z": 650}).next_due_ms() == 650
    assert BarrierState(key=KEY, waiting=(waiting_a,), completions={"queue://kitchen": completion}).next_due_ms() == 700
    assert BarrierState(key=KEY, waiting=(waiting_a,)).next_due_ms() == 900


@PROPERTY
@given(
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=5),
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=4),
    st.lists(st.integers(min_value=0, max_value=10**12), max_size=4),
)
def test_next_due_ms_is_the_min_of_all_instants(deadlines: list[int], expiries: list[int], settled: list[int]) -> None:
    state = BarrierState(
        key=KEY,
        waiting=tuple(Waiting(f"ex-{i}", "dispatch", 0, deadline, ("queue://kitchen",), {}, 1) for i, deadline in enumerate(deadlines)),
        completions={f"flow-{i}": FlowCompletion(f"flow-{i}", COMPLETED, 0, expiry) for i, expiry in enumerate(expiries)},
        settled={f"done-{i}": until for i, until in enumerate(settled)},
    )
    assert state.next_due_ms() == min([*deadlines, *expiries, *settled], default=None)


# --------------------------------------------------------------------------------------------------------------
# Serialization round trips.
# --------------------------------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=12)
instants = st.integers(min_value=0, max_value=2**53)
json_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53) | st.text(max_size=10)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)

completions = st.builds(
    FlowCompletion,
    flow=names,
    outcome=st.sampled_from([COMPLETED, FAILED]),
    at_ms=instants,
    expires_ms=instants,
    error=st.none() | st.text(max_size=30),
)
waitings = st.builds(
    Waiting,
    exchange_id=names,
    flow=names,
    arrived_ms=instants,
    deadline_ms=instants,
    awaited=st.lists(names, max_size=4, unique=True).map(tuple),
    exchange=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    resume_step=st.integers(min_value=0, max_value=1_000),
    satisfied=st.lists(names, max_size=4, unique=True).map(tuple),
)
states = st.builds(
    BarrierState,
    key=names,
    waiting=st.lists(waitings, max_size=3).map(tuple),
    completions=st.dictionaries(names, completions, max_size=3),
    settled=st.dictionaries(names, instants, max_size=3),
)


@ROUND_TRIP
@given(completions)
def test_completion_round_trips(completion: FlowCompletion) -> None:
    assert FlowCompletion.from_dict(completion.to_dict()) == completion
    assert FlowCompletion.from_dict(json.loads(json.dumps(completion.to_dict()))) == completion


@ROUND_TRIP
@given(waitings)
def test_waiting_round_trips(waiting: Waiting) -> None:
    assert Waiting.from_dict(waiting.to_dict()) == waiting
    assert Waiting.from_dict(json.loads(json.dumps(waiting.to_dict()))) == waiting


@ROUND_TRIP
@given(states)
def test_barrier_state_round_trips(state: BarrierState) -> None:
    assert BarrierState.from_dict(state.to_dict()) == state
    restored = BarrierState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    assert restored.next_due_ms() == state.next_due_ms()
    assert restored.is_empty() == state.is_empty()


def test_a_state_restored_mid_wait_behaves_like_the_original() -> None:
    barrier = Barrier()
    barrier.arrive(waiting_for(("queue://kitchen", "queue://payment"), barrier.now))
    barrier.complete("queue://kitchen")
    assert barrier.state is not None
    barrier.state = BarrierState.from_dict(json.loads(json.dumps(barrier.state.to_dict())))
    barrier.now += 1
    transition = barrier.complete("queue://payment")
    assert len(transition.releases) == 1
    assert sorted(transition.releases[0].waiting.satisfied) == ["queue://kitchen", "queue://payment"]
    assert transition.releases[0].waiting.exchange == exchange_snapshot()
