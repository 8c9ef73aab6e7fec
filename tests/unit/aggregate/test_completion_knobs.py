"""The aggregator's timeouts and operator forces on the pure core, with a virtual clock.

An absolute deadline, an inactivity deadline, both (the first due wins), neither; force-complete and
force-discard; duplicates counted. Each property drives ``on_item``/``on_expire``/``on_force`` the way the
aggregate stage does (a tick is ``on_expire`` at the tick's clock).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.tables.aggregates import (
    DISCARDED,
    FORCED,
    INACTIVITY,
    REOPENING,
    TIMEOUT,
    AggregatorConfig,
    GroupState,
    GroupTransition,
    ItemOutcome,
    Part,
    on_expire,
    on_force,
    on_item,
    on_open,
    on_part,
)

PROPERTY = settings(max_examples=200, deadline=None)


def outcome(index: int) -> ItemOutcome:
    return ItemOutcome(index=index, ok=True, result={"index": index})


def run(config: AggregatorConfig, total: int, arrivals: list[tuple[int, int]], ticks: list[int]) -> tuple[GroupTransition, list[int]]:
    """Open a group of ``total`` at 0, then merge ``(time, index)`` arrivals and tick at ``ticks``, in time order.

    Returns the transition that ended the group (or the last one) and the indexes merged before it ended.
    """
    state = on_open(None, "g", total, config.deadline_from(0), 0, config=config).state
    events = sorted([(at, 0, index) for at, index in arrivals] + [(at, 1, -1) for at in ticks])
    merged: list[int] = []
    transition = GroupTransition(state=state)
    for at, kind, index in events:
        transition = on_expire(state, config, at) if kind == 1 else on_item(state, config, "g", outcome(index), total, False, at)
        if transition.done is not None:
            return transition, merged
        if kind == 0 and transition.state is not None and index in transition.state.received and index not in merged:
            merged.append(index)
        state = transition.state
    return transition, merged


def first_tick_at_or_after(at: int) -> int:
    return max(100, -(-at // 100) * 100)


def quiet_activity(times: list[int], quiet_ms: int, *, timeout_ms: int | None) -> int:
    """The oracle: the time of the last arrival merged before a tick found the group due (ticks every 100 ms;
    an arrival at a tick's time comes before it)."""
    last_activity = 0
    for at in times:
        due = last_activity + quiet_ms if timeout_ms is None else min(timeout_ms, last_activity + quiet_ms)
        if first_tick_at_or_after(due) < at:
            break
        last_activity = at
    return last_activity


arrival_gaps = st.lists(st.integers(min_value=1, max_value=3_000), min_size=1, max_size=12)


@PROPERTY
@given(gaps=arrival_gaps, quiet_ms=st.integers(min_value=500, max_value=2_500))
def test_an_inactivity_timeout_closes_a_group_only_after_a_quiet_period(gaps: list[int], quiet_ms: int) -> None:
    """Items keep coming with gaps; a tick every 100 ms. The group stays open while no gap reaches ``quiet_ms``
    and closes, reason ``inactivity``, within one tick after the first quiet period; each merged index once."""
    config = AggregatorConfig(name="quiet", timeout_ms=None, inactivity_ms=quiet_ms)
    times = [sum(gaps[: position + 1]) for position in range(len(gaps))]
    total = len(times) + 1  # one index never comes: only the timeout can close it
    arrivals = [(at, index) for index, at in enumerate(times)]
    horizon = times[-1] + quiet_ms + 1_000
    ticks = list(range(100, horizon, 100))
    transition, merged = run(config, total, arrivals, ticks)
    assert transition.done is not None
    [result] = transition.emits
    assert result["reason"] == INACTIVITY
    assert result["status"] == "partial"
    last_activity = quiet_activity(times, quiet_ms, timeout_ms=None)
    closed = result["completed_ms"]
    assert last_activity + quiet_ms <= closed < last_activity + quiet_ms + 100
    assert sorted(merged) == [index for index, at in enumerate(times) if at <= last_activity]
    assert [item["index"] for item in result["items"] if item["status"] == "ok"] == sorted(merged)


@PROPERTY
@given(gaps=arrival_gaps, timeout_ms=st.integers(min_value=500, max_value=8_000), quiet_ms=st.integers(min_value=500, max_value=4_000))
def test_with_both_deadlines_the_first_due_wins_and_is_named(gaps: list[int], timeout_ms: int, quiet_ms: int) -> None:
    config = AggregatorConfig(name="both", timeout_ms=timeout_ms, inactivity_ms=quiet_ms)
    times = [sum(gaps[: position + 1]) for position in range(len(gaps))]
    arrivals = [(at, index) for index, at in enumerate(times)]
    ticks = list(range(100, times[-1] + timeout_ms + quiet_ms + 1_000, 100))
    transition, _ = run(config, len(times) + 1, arrivals, ticks)
    [result] = transition.emits
    last_activity = quiet_activity(times, quiet_ms, timeout_ms=timeout_ms)
    inactive_at = last_activity + quiet_ms
    expected = TIMEOUT if timeout_ms <= inactive_at else INACTIVITY
    assert result["reason"] == expected
    assert result["completed_ms"] - min(timeout_ms, inactive_at) < 100


def test_without_any_timeout_a_group_waits_for_its_items_whatever_the_clock() -> None:
    config = AggregatorConfig(name="patient", timeout_ms=None)
    state = on_open(None, "g", 2, config.deadline_from(0), 0, config=config).state
    assert state is not None
    assert state.deadline_ms is None
    assert state.due_ms(config) is None
    assert on_expire(state, config, 10**12).state is state
    done = on_item(on_item(state, config, "g", outcome(1), 2, False, 5).state, config, "g", outcome(0), 2, False, 10**12)
    assert done.emits[0]["status"] == "complete"


def test_the_absolute_deadline_is_not_moved_by_arrivals() -> None:
    config = AggregatorConfig(name="absolute", timeout_ms=1_000)
    state = on_open(None, "g", 3, config.deadline_from(0), 0, config=config).state
    state = on_item(state, config, "g", outcome(0), 3, False, 900).state
    assert state is not None
    assert state.due_ms(config) == 1_000
    [result] = on_expire(state, config, 1_000).emits
    assert (result["reason"], result["missing"]) == (TIMEOUT, [1, 2])


@pytest.mark.parametrize("received", [[], [0], [0, 1, 2]])
def test_force_complete_completes_with_what_the_group_has(received: list[int]) -> None:
    config = AggregatorConfig(name="forced", timeout_ms=None)
    state = on_open(None, "g", 3, None, 0, config=config).state
    for index in received[:2]:  # the third would complete it by count
        state = on_item(state, config, "g", outcome(index), 3, False, 1).state
    transition = on_force(state, config, "complete", 7)
    [result] = transition.emits
    assert transition.state is None
    assert transition.done is not None
    assert result["reason"] == FORCED
    assert result["status"] == "partial"
    assert result["missing"] == [index for index in range(3) if index not in received[:2]]
    assert transition.done.status == "partial"


def test_force_complete_of_a_group_with_nothing_missing_is_complete() -> None:
    """Flag-only groups learn their size from the last flag; forced after it with an index missing stays partial,
    and a group whose every announced index is in (count not configured) is complete."""
    config = AggregatorConfig(name="flag", timeout_ms=None, complete_by=frozenset({"flag"}))
    state = on_item(None, config, "g", outcome(0), None, False, 1).state
    state = on_item(state, config, "g", outcome(1), None, False, 2).state
    assert state is not None
    assert state.expected_count is None
    [result] = on_force(state, config, "complete", 3).emits
    assert result["status"] == "partial"  # nobody said how many there are: never claimed complete


def test_force_discard_sends_what_it_had_as_discarded() -> None:
    config = AggregatorConfig(name="discard", timeout_ms=5_000)
    state = on_item(None, config, "g", outcome(1), 3, False, 1).state
    transition = on_force(state, config, "discard", 2)
    [result] = transition.emits
    assert (result["status"], result["reason"]) == (DISCARDED, FORCED)
    assert [item["status"] for item in result["items"]] == ["missing", "ok", "missing"]
    assert transition.done is not None
    assert transition.done.status == DISCARDED


def test_force_on_no_group_changes_nothing_and_a_bad_action_is_refused() -> None:
    config = AggregatorConfig(name="none", timeout_ms=5_000)
    assert on_force(None, config, "complete", 1) == GroupTransition(state=None)
    with pytest.raises(ValueError, match="force action"):
        on_force(None, config, "explode", 1)


@PROPERTY
@given(st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=30))
def test_duplicates_are_counted_and_reported_never_merged(deliveries: list[int]) -> None:
    config = AggregatorConfig(name="dups", timeout_ms=None, complete_by=frozenset({"count"}))
    state: GroupState | None = None
    transition = GroupTransition(state=None)
    seen: set[int] = set()
    duplicates = 0
    for index in deliveries:
        transition = on_item(state, config, "g", outcome(index), 5, False, 1)
        if index in seen:
            duplicates += 1
        seen.add(index)
        if transition.done is not None:
            break
        state = transition.state
    if transition.done is not None:
        [result] = transition.emits
        assert result["duplicates"] == duplicates
    else:
        assert state is not None
        assert state.duplicates == duplicates
        round_tripped: Any = GroupState.from_dict(state.to_dict())
        assert round_tripped == state


@pytest.mark.parametrize("knob", ["timeout_ms", "inactivity_ms"])
@pytest.mark.parametrize("value", [0, -5, True, 1.5])
def test_config_refuses_a_timeout_that_is_not_a_positive_integer(knob: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"timeout_ms": 1_000, knob: value}
    with pytest.raises(ValueError, match=f"{knob} must be a positive integer or None"):
        AggregatorConfig(name="bad", **kwargs)


# --------------------------------------------------------------------------------------------------------------
# Correlation groups: parts without indexes, by size, flag or predicate; one-shot or reopening keys.


def deliver(config: AggregatorConfig, messages: list[tuple[str, int, bool]], redeliver: list[int]) -> tuple[list[dict[str, Any]], dict]:
    """Feed ``(key, value, flag)`` messages at positions 0.. (and redeliveries of earlier positions, ``redeliver``:
    after message i, message redeliver[i] % (i + 1) again); return the results and the final states by key."""
    states: dict[str, Any] = {}
    results: list[dict[str, Any]] = []

    def feed(position: int) -> None:
        key, value, flag = messages[position]
        transition = on_part(states.get(key), config, key, Part(payload=value, position=(0, position, 0), flag=flag), position)
        states[key] = transition.done if transition.done is not None else transition.state
        results.extend(transition.emits)

    for position in range(len(messages)):
        feed(position)
        if position < len(redeliver):
            feed(redeliver[position] % (position + 1))
    return results, states


messages_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 10**6), st.booleans()), min_size=1, max_size=60
).map(lambda rows: [(key, number, flag) for number, (key, _, flag) in enumerate(rows)])


@PROPERTY
@given(messages=messages_strategy, size=st.integers(1, 5), redeliver=st.lists(st.integers(0, 10**6), max_size=60))
def test_a_reopening_key_puts_every_message_in_exactly_one_group_in_order(
    messages: list[tuple[str, int, bool]], size: int, redeliver: list[int]
) -> None:
    """Batch every ``size`` messages per key, a flagged message closing its batch early: every message lands in
    exactly one batch, batches of a key are numbered 0, 1, 2... and hold its messages in order, redeliveries
    change nothing but the duplicate count, and only the last batch of a key may still be open."""
    config = AggregatorConfig(name="batches", timeout_ms=None, groups=REOPENING, complete_size=size)
    results, states = deliver(config, messages, redeliver)
    for key in {key for key, _, _ in messages}:
        sent = [value for each, value, _ in messages if each == key]
        batches = [result for result in results if result["correlation_id"] == key]
        assert [batch["sequence"] for batch in batches] == list(range(len(batches)))
        grouped = [item["result"] for batch in batches for item in batch["items"]]
        state = states[key]
        still_open = [outcome.result for _, outcome in sorted(state.received.items())] if isinstance(state, GroupState) else []
        assert grouped + still_open == sent, "each message in exactly one batch, in order"
        for batch in batches:
            assert batch["status"] == "complete"
            flagged = any(flag for each, value, flag in messages if each == key and value == batch["items"][-1]["result"])
            assert len(batch["items"]) == size or flagged
            assert batch["reason"] == ("flag" if flagged else "size")
        assert len(still_open) < size


@PROPERTY
@given(messages=messages_strategy, redeliver=st.lists(st.integers(0, 10**6), max_size=60))
def test_a_one_shot_key_completes_once_and_counts_what_comes_after(messages: list[tuple[str, int, bool]], redeliver: list[int]) -> None:
    config = AggregatorConfig(name="once", timeout_ms=None, complete_size=3)
    results, states = deliver(config, messages, redeliver)
    for key in {key for key, _, _ in messages}:
        sent = [value for each, value, _ in messages if each == key]
        [result] = [result for result in results if result["correlation_id"] == key] or [None]
        if result is None:
            assert len(sent) < 3
            assert not any(flag for each, _, flag in messages if each == key)
            continue
        merged_values = [item["result"] for item in result["items"]]
        assert merged_values == sent[: len(merged_values)]
        assert states[key].late_parts == len(sent) - len(merged_values)


def test_a_predicate_completes_the_group_when_it_holds() -> None:
    config = AggregatorConfig(name="sum", timeout_ms=None, complete_when=lambda values: sum(values) >= 10)
    state = None
    emitted: list[dict[str, Any]] = []
    for position, value in enumerate([4, 3, 5, 1]):
        transition = on_part(state, config, "k", Part(payload=value, position=(0, position, 0)), position)
        state = transition.done if transition.done is not None else transition.state
        emitted.extend(transition.emits)
    [result] = emitted
    assert (result["reason"], [item["result"] for item in result["items"]]) == ("predicate", [4, 3, 5])


def test_a_correlation_group_keeps_the_first_parts_context_and_times_out_on_inactivity() -> None:
    config = AggregatorConfig(name="ctx", timeout_ms=None, inactivity_ms=1_000)
    first = on_part(None, config, "k", Part(payload=1, position=(0, 1, 0), context="first"), 0).state
    second = on_part(first, config, "k", Part(payload=2, position=(0, 2, 0), context="second"), 500).state
    assert second is not None
    assert second.context == "first"
    assert on_expire(second, config, 1_499).state is second
    expired = on_expire(second, config, 1_500)
    assert expired.emits[0]["reason"] == INACTIVITY
    assert expired.context == "first"


def test_a_timed_out_correlation_group_names_the_size_it_expected() -> None:
    sized = AggregatorConfig(name="sized", timeout_ms=1_000, complete_size=3)
    state = on_part(None, sized, "k", Part(payload=1, position=(0, 1, 0)), 0).state
    state = on_part(state, sized, "k", Part(payload=2, position=(0, 2, 0)), 10).state
    assert state is not None
    [result] = on_expire(state, sized, 1_000).emits
    assert (result["status"], result["reason"], result["expected_count"], len(result["items"])) == ("partial", "timeout", 3, 2)
    unsized = AggregatorConfig(name="unsized", timeout_ms=1_000)
    state = on_part(None, unsized, "k", Part(payload=1, position=(0, 1, 0)), 0).state
    assert state is not None
    assert on_expire(state, unsized, 1_000).emits[0]["expected_count"] is None, "nothing said how many: none named"


def test_a_period_ends_every_group_opened_in_it_complete_or_partial_by_what_it_expected() -> None:
    config = AggregatorConfig(name="period", timeout_ms=None, complete_interval_ms=1_000)
    whole = on_item(None, config, "whole", outcome(0), 2, False, 1_200).state
    whole = on_item(whole, config, "whole", outcome(1), 2, False, 1_300)
    assert whole.done is not None, "complete by count before the period ended"
    half = on_item(None, config, "half", outcome(0), 2, False, 1_400).state
    assert half is not None
    assert half.due_ms(config) == 2_000, "the end of the period it opened in"
    assert on_expire(half, config, 1_999).state is half
    [result] = on_expire(half, config, 2_000).emits
    assert (result["status"], result["reason"], result["missing"]) == ("partial", "interval", [1])
    parts = on_part(None, config, "k", Part(payload=1, position=(0, 1, 0)), 2_500).state
    assert parts is not None
    assert (on_expire(parts, config, 3_000).emits[0]["status"], on_expire(parts, config, 3_000).emits[0]["reason"]) == (
        "complete",
        "interval",
    )
