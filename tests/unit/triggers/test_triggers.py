"""Unit and property tests for the counter trigger's pure core (``tables/triggers.py``) and its sweep queue.

Time is a fake clock (plain ints); nothing here sleeps or touches Kafka.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.tables.triggers import (
    OK,
    ChildCompletion,
    FiredState,
    TriggerConfig,
    TriggerState,
    Wake,
    completion_message,
    on_completion,
    on_register,
    on_sweep,
    outcome_summary,
    registration_message,
    sweep_asks,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG = TriggerConfig(name="t", sweep_grace_ms=1_000, done_retention_ms=60_000)
PARENT = "parent-1"


@dataclass
class Fold:
    """Drives the core the way the trigger agent does: a parent's consecutive completions go in as one batch."""

    expected: int
    now: int = 10_000
    state: TriggerState | None = None
    fired: FiredState | None = None
    wakes: list[Wake] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def register(self) -> None:
        self._take(on_register(self.state, self.fired, PARENT, self.expected, "wake", self.now, config=CONFIG, context={"step": 3}))

    def complete(self, batch: list[ChildCompletion]) -> None:
        self._take(on_completion(self.state, self.fired, PARENT, batch, self.now, config=CONFIG))

    def sweep(self, statuses: dict[str, str]) -> None:
        self._take(on_sweep(self.state, self.fired, statuses, self.now, config=CONFIG))

    def _take(self, transition: Any) -> None:
        self.state, self.fired = transition.state, transition.fired
        self.rejected.extend(transition.rejected)
        if transition.wake is not None:
            self.wakes.append(transition.wake)
        self.now += 7


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, dict[str, str], list[Any], list[int]]:
    """Children with outcomes; every completion delivered at least once, some twice or more; registrations (one or
    more) anywhere; the event sequence cut into batches of any size."""
    expected = draw(st.integers(min_value=1, max_value=8))
    outcomes = {f"c{index}": draw(st.sampled_from([OK, OK, "failed", "timeout"])) for index in range(expected)}
    events: list[Any] = [ChildCompletion(child, outcome) for child, outcome in outcomes.items()]
    events += [ChildCompletion(child, outcomes[child]) for child in draw(st.lists(st.sampled_from(sorted(outcomes)), max_size=6))]
    events += ["register"] * draw(st.integers(min_value=1, max_value=3))
    events = draw(st.permutations(events))
    cuts = draw(st.lists(st.integers(min_value=1, max_value=len(events)), max_size=len(events)))
    return expected, outcomes, list(events), sorted(set(cuts))


def run(expected: int, events: list[Any], cuts: list[int]) -> Fold:
    """Events in order; a cut ends a batch. Within a batch, consecutive completions make one on_completion call."""
    fold = Fold(expected)
    start = 0
    for end in [*cuts, len(events)]:
        pending: list[ChildCompletion] = []
        for item in events[start:end]:
            if isinstance(item, ChildCompletion):
                pending.append(item)
                continue
            if pending:
                fold.complete(pending)
            pending = []
            fold.register()
        if pending:
            fold.complete(pending)
        start = end
    return fold


@PROPERTY
@given(scenarios())
def test_any_order_duplication_and_batching_fires_once_with_the_same_summary(
    scenario: tuple[int, dict[str, str], list[Any], list[int]],
) -> None:
    expected, outcomes, events, cuts = scenario
    batched = run(expected, events, cuts)
    one_by_one = run(expected, events, list(range(1, len(events))))
    for fold in (batched, one_by_one):
        assert len(fold.wakes) == 1, f"fired {len(fold.wakes)} times"
        [wake] = fold.wakes
        assert wake.topic == "wake"
        assert wake.record["summary"] == outcome_summary(outcomes)
        assert wake.record["summary"]["failed"] == sorted(child for child, outcome in outcomes.items() if outcome != OK)
        assert wake.record["context"] == {"step": 3}
        assert fold.state is None
        assert fold.fired is not None
        assert not fold.rejected
    assert batched.wakes[0].record["summary"] == one_by_one.wakes[0].record["summary"]
    assert batched.fired is not None
    assert one_by_one.fired is not None
    assert batched.fired.fired_by == one_by_one.fired.fired_by
    first_registration = events.index("register")
    all_before = {item.child_id for item in events[:first_registration] if isinstance(item, ChildCompletion)} == set(outcomes)
    assert (batched.fired.fired_by == "registration") == all_before


@PROPERTY
@given(scenarios(), st.lists(st.sampled_from(["c0", "c1", "c2", "extra"]), min_size=1, max_size=5))
def test_completions_after_the_firing_never_fire_again(scenario: tuple[int, dict[str, str], list[Any], list[int]], late: list[str]) -> None:
    expected, _, events, cuts = scenario
    fold = run(expected, events, cuts)
    assert fold.fired is not None
    before = fold.fired.late_completions
    fold.complete([ChildCompletion(child, OK) for child in late])
    fold.register()
    fold.sweep({child: OK for child in late})
    assert len(fold.wakes) == 1
    assert fold.state is None
    assert fold.fired.late_completions == before + len(late)


def test_registration_after_all_completions_fires_at_registration() -> None:
    fold = Fold(expected=3)
    fold.complete([ChildCompletion("a", OK), ChildCompletion("b", "failed")])
    fold.complete([ChildCompletion("c", OK), ChildCompletion("a", OK)])
    assert fold.wakes == []
    assert fold.state is not None
    assert fold.state.remaining is None
    fold.register()
    [wake] = fold.wakes
    assert wake.record["fired_by"] == "registration"
    assert wake.record["summary"] == {"children": 3, "by_outcome": {"failed": 1, "ok": 2}, "failed": ["b"]}


def test_counter_counts_down_once_per_child_and_fires_at_zero() -> None:
    fold = Fold(expected=3)
    fold.register()
    fold.complete([ChildCompletion("a", OK), ChildCompletion("a", OK)])
    assert fold.state is not None
    assert fold.state.remaining == 2
    fold.complete([ChildCompletion("b", OK)])
    assert fold.state is not None
    assert fold.state.remaining == 1
    assert not fold.wakes
    fold.complete([ChildCompletion("c", "boom"), ChildCompletion("d", OK)])  # d comes after zero: absorbed, counted late
    [wake] = fold.wakes
    assert wake.record["fired_by"] == "count"
    assert wake.record["summary"]["failed"] == ["c"]
    assert fold.fired is not None
    assert fold.fired.late_completions == 1


def test_a_conflicting_registration_is_refused_and_a_repeat_changes_nothing() -> None:
    fold = Fold(expected=2)
    fold.register()
    state = fold.state
    fold.register()
    assert fold.state == state
    assert not fold.rejected
    transition = on_register(fold.state, None, PARENT, 5, "wake", fold.now, config=CONFIG)
    assert transition.state == state
    assert transition.rejected
    assert "expects 5 children" in transition.rejected[0]
    assert "registered with 2" in transition.rejected[0]


@st.composite
def sweep_scenarios(draw: st.DrawFn) -> tuple[int, dict[str, str], set[str], set[str]]:
    expected = draw(st.integers(min_value=1, max_value=8))
    outcomes = {f"c{index}": draw(st.sampled_from([OK, "failed"])) for index in range(expected)}
    children = sorted(outcomes)
    delivered = set(draw(st.lists(st.sampled_from(children), unique=True)))  # completion events that were not lost
    recorded = set(draw(st.lists(st.sampled_from(children), unique=True)))  # final statuses recorded so far
    return expected, outcomes, delivered, recorded


@PROPERTY
@given(sweep_scenarios(), st.integers(min_value=0, max_value=3_000))
def test_sweep_fires_exactly_when_all_children_are_done_and_never_twice(
    scenario: tuple[int, dict[str, str], set[str], set[str]], elapsed_ms: int
) -> None:
    expected, outcomes, delivered, recorded = scenario
    fold = Fold(expected)
    fold.register()
    assert fold.state is not None
    assert fold.state.registered_ms is not None
    registered_ms = fold.state.registered_ms
    fold.complete([ChildCompletion(child, outcomes[child]) for child in sorted(delivered)])
    fired_by_count = len(delivered) == expected
    assert len(fold.wakes) == int(fired_by_count)
    fold.now = registered_ms + elapsed_ms
    statuses = {child: outcomes[child] for child in recorded}
    fold.sweep(statuses)
    all_done = len(delivered | recorded) == expected
    past_grace = elapsed_ms >= CONFIG.sweep_grace_ms
    if fired_by_count:
        assert len(fold.wakes) == 1
        assert fold.wakes[0].record["fired_by"] == "count"
    elif all_done and past_grace:
        assert len(fold.wakes) == 1
        assert fold.wakes[0].record["fired_by"] == "sweep"
        assert fold.wakes[0].record["summary"] == outcome_summary(outcomes)
    else:
        assert fold.wakes == [], "the sweep fired a trigger whose children are not all done, or within its grace"
        assert fold.state is not None
    # whatever happened, more sweeps (with every child now done) and redelivered completions fire at most once in total
    for _ in range(2):
        fold.now += CONFIG.sweep_grace_ms
        fold.sweep(dict(outcomes))
        fold.complete([ChildCompletion(child, outcome) for child, outcome in outcomes.items()])
    assert len(fold.wakes) == 1


def test_sweep_never_fires_an_unregistered_trigger() -> None:
    fold = Fold(expected=1)
    fold.complete([ChildCompletion("a", OK)])
    fold.now += 10 * CONFIG.sweep_grace_ms
    fold.sweep({"a": OK})
    assert fold.wakes == []
    assert fold.state is not None


states = st.builds(
    TriggerState,
    parent_id=st.text(min_size=1, max_size=8),
    first_seen_ms=st.integers(min_value=0, max_value=2**40),
    expected_count=st.none() | st.integers(min_value=1, max_value=50),
    wake_topic=st.none() | st.text(min_size=1, max_size=8),
    context=st.none() | st.dictionaries(st.text(max_size=4), st.integers()),
    registered_ms=st.none() | st.integers(min_value=0, max_value=2**40),
    children=st.dictionaries(st.text(min_size=1, max_size=6), st.sampled_from([OK, "failed"]), max_size=10),
)
fired_states = st.builds(
    FiredState,
    parent_id=st.text(min_size=1, max_size=8),
    fired_ms=st.integers(min_value=0, max_value=2**40),
    expires_ms=st.integers(min_value=0, max_value=2**41),
    fired_by=st.sampled_from(["count", "registration", "sweep"]),
    late_completions=st.integers(min_value=0, max_value=100),
)


@settings(max_examples=200, deadline=None, database=None)
@given(states)
def test_trigger_state_round_trips(state: TriggerState) -> None:
    assert TriggerState.from_dict(state.to_dict()) == state


@settings(max_examples=200, deadline=None, database=None)
@given(fired_states)
def test_fired_state_round_trips(fired: FiredState) -> None:
    assert FiredState.from_dict(fired.to_dict()) == fired


def test_messages_name_the_parent_and_refuse_a_bad_count() -> None:
    key, body = registration_message("p", 3, context={"order": 1})
    assert key == "p"
    assert body["expected_count"] == 3
    assert body["wake_topic"] == "trigger-fired"
    assert completion_message("p", "c", "failed") == ("p", {"kind": "completion", "parent_id": "p", "child_id": "c", "outcome": "failed"})
    with pytest.raises(ValueError, match="expected_count must be a positive integer"):
        registration_message("p", 0)
    with pytest.raises(ValueError, match="sweep_grace_ms"):
        TriggerConfig(name="bad", sweep_grace_ms=-1)


# ---------------------------------------------------------------------------------------------------
# The sweep queue, over a dict standing in for a Faust table.


def test_sweep_queue_reads_one_page_per_step_resumes_from_its_cursor_and_stops_at_entries_not_due() -> None:
    from weir.tables.trigger_tables import SweepQueue

    table: dict[str, Any] = {}
    queue = SweepQueue(table)  # type: ignore[arg-type]
    queue.file(0, [(f"p{number}", 100 + number) for number in range(10)])
    queue.file(1, [("other", 0)])
    seen: list[str] = []

    async def visit(parent_id: str) -> int | None:
        seen.append(parent_id)
        return 10_000 if parent_id == "p1" else None  # p1 still waits: filed again, due later

    more = asyncio.run(queue.step(0, 105, 4, visit))
    assert seen == ["p0", "p1", "p2", "p3"]
    assert more
    more = asyncio.run(queue.step(0, 105, 4, visit))
    assert seen[4:] == ["p4", "p5"]
    assert not more, "p6 is due at 106: the step stops there"
    assert queue.waiting(0) == 5  # p6..p9 and p1 again
    more = asyncio.run(queue.step(0, 20_000, 100, visit))
    assert seen[6:] == ["p6", "p7", "p8", "p9", "p1"]
    assert queue.waiting(0) == 1
    assert queue.waiting(1) == 1
    assert len([key for key in table if key.startswith("0:") and key not in ("0:head", "0:tail")]) == 1


# ---------------------------------------------------------------------------------------------------
# The sweep's source of truth: statuses committed with the children's work (app/trigger_status.py), read by the
# sweep at any time, with completion events lost, late or repeated.


@st.composite
def committed_timelines(draw: st.DrawFn) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Children with outcomes and a timeline: each child commits (its status row) once, then its completion comes
    0 to 2 times (0: lost with the child); the registration anywhere; sweeps anywhere, each some time after the last."""
    expected = draw(st.integers(min_value=1, max_value=6))
    outcomes = {f"c{index}": draw(st.sampled_from([OK, "failed"])) for index in range(expected)}
    timeline: list[tuple[str, str]] = [("register", "")]
    for child in outcomes:
        position = draw(st.integers(min_value=0, max_value=len(timeline)))
        timeline.insert(position, ("commit", child))
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            later = draw(st.integers(min_value=position + 1, max_value=len(timeline)))
            timeline.insert(later, ("completion", child))
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        timeline.insert(draw(st.integers(min_value=0, max_value=len(timeline))), ("sweep", str(draw(st.integers(0, 1_500)))))
    return outcomes, timeline


@PROPERTY
@given(committed_timelines())
def test_the_committed_statuses_wake_the_parent_once_never_before_every_child_committed(
    scenario: tuple[dict[str, str], list[tuple[str, str]]],
) -> None:
    outcomes, timeline = scenario
    fold = Fold(len(outcomes))
    committed: dict[str, str] = {}  # the status table: what the children's transactions committed so far
    delivered: set[str] = set()
    for kind, argument in timeline:
        wakes_before = len(fold.wakes)
        if kind == "register":
            fold.register()
        elif kind == "commit":
            committed[argument] = outcomes[argument]
        elif kind == "completion":
            delivered.add(argument)
            fold.complete([ChildCompletion(argument, outcomes[argument])])
        else:
            fold.now += int(argument)
            fold.sweep(dict(committed))
        if len(fold.wakes) > wakes_before:
            assert set(committed) == set(outcomes), "woken before every child had committed its work"
            if fold.wakes[-1].record["fired_by"] == "sweep":
                assert delivered != set(outcomes), "the sweep fired a parent whose completions had all come"
    # Later: the sweep after the grace period reads every child's committed status.
    fold.now += CONFIG.sweep_grace_ms
    fold.sweep(dict(committed))
    assert len(fold.wakes) == 1, f"woken {len(fold.wakes)} times"
    assert fold.wakes[0].record["summary"] == outcome_summary(outcomes)
    # and the completions the relay publishes after all (or publishes again) change nothing
    fold.complete([ChildCompletion(child, outcome) for child, outcome in outcomes.items()])
    fold.sweep(dict(committed))
    assert len(fold.wakes) == 1
    assert fold.state is None


@PROPERTY
@given(
    states.filter(lambda state: state.expected_count is None or state.wake_topic is not None),
    st.none() | fired_states,
    st.integers(min_value=0, max_value=2**41),
)
def test_the_sweep_asks_about_every_trigger_it_could_fire(state: TriggerState, fired: FiredState | None, now_ms: int) -> None:
    """The shell queries the status source only for the parents ``sweep_asks`` names: it must name every one that
    ``on_sweep`` would fire with every child done."""
    everything = {f"x{index}": OK for index in range(state.expected_count or 0)}
    fires = on_sweep(state, fired, everything, now_ms, config=CONFIG).wake is not None
    assert fires == sweep_asks(state, fired, now_ms, CONFIG)
