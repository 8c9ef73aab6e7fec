"""Unit and property tests for the pure split/aggregate state core in ``tables/aggregates.py``.

Time is a fake clock (plain ints); nothing here sleeps or touches Kafka/Faust.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.tables.aggregates import (
    AggregatorConfig,
    DoneState,
    GroupState,
    GroupTransition,
    ItemOutcome,
    merged_result,
    on_expire,
    on_item,
    on_late_item,
    on_open,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=200, deadline=None, database=None)

BOTH = AggregatorConfig(name="agg", timeout_ms=5_000)
COUNT_ONLY = AggregatorConfig(name="agg-count", timeout_ms=5_000, complete_by=frozenset({"count"}))
FLAG_ONLY = AggregatorConfig(name="agg-flag", timeout_ms=5_000, complete_by=frozenset({"flag"}))

TIME_KEYS = ("completed_ms", "opened_ms", "duplicates")


def outcome_for(index: int, ok: bool) -> ItemOutcome:
    if ok:
        return ItemOutcome(index=index, ok=True, result={"value": index * 10})
    return ItemOutcome(index=index, ok=False, error=f"ValueError: item {index} broke")


def without_times(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key not in TIME_KEYS}


@dataclass
class Fold:
    """Drives the core the way the aggregator agent does: on_item while open, on_late_item once done."""

    config: AggregatorConfig
    correlation_id: str = "group-1"
    now: int = 1_000
    state: GroupState | None = None
    done: DoneState | None = None
    emits: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[GroupTransition] = field(default_factory=list)

    def tick(self) -> int:
        self.now += 7
        return self.now

    def open(self, total: int | None, deadline_ms: int) -> GroupTransition:
        transition = on_open(self.state, self.correlation_id, total, deadline_ms, self.tick(), config=self.config)
        self.state = transition.state
        return transition

    def item(self, outcome: ItemOutcome, total: int | None, last: bool) -> GroupTransition | None:
        if self.done is not None:
            self.done = on_late_item(self.done, outcome.index)
            return None
        transition = on_item(self.state, self.config, self.correlation_id, outcome, total, last, self.tick())
        self.transitions.append(transition)
        self.state = transition.state
        self.emits.extend(transition.emits)
        if transition.done is not None:
            self.done = transition.done
        return transition


# --------------------------------------------------------------------------------------------------------------
# The main property: any order, any duplication, one identical result.
# --------------------------------------------------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    count = draw(st.integers(min_value=1, max_value=30))
    oks = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    mode = draw(st.sampled_from(["count", "flag"]))
    if mode == "count":
        config = draw(st.sampled_from([BOTH, COUNT_ONLY]))
        item_total: int | None = count
        flag_last = draw(st.booleans())
        open_total = draw(st.sampled_from(["none", "with-total", "without-total"]))
    else:
        config = draw(st.sampled_from([BOTH, FLAG_ONLY]))
        item_total = None
        flag_last = True
        # A flag-only aggregator ignores an announced total (test_flag_only_config_does_not_complete_by_an_opened_total).
        open_total = draw(st.sampled_from(["none", "with-total", "without-total"])) if config == FLAG_ONLY else "without-total"
    extras = draw(st.lists(st.integers(min_value=0, max_value=count - 1), max_size=2 * count))
    deliveries = draw(st.permutations(list(range(count)) + extras))
    return {
        "count": count,
        "oks": oks,
        "config": config,
        "item_total": item_total,
        "flag_last": flag_last,
        "open_total": open_total,
        "deliveries": deliveries,
    }


def run_scenario(scenario: dict[str, Any], deliveries: list[int]) -> Fold:
    count = scenario["count"]
    fold = Fold(config=scenario["config"])
    if scenario["open_total"] != "none":
        total = count if scenario["open_total"] == "with-total" else None
        fold.open(total, deadline_ms=10**9)
    seen: set[int] = set()
    late: set[int] = set()
    for index in deliveries:
        was_done = fold.done is not None
        previous = fold.state
        transition = fold.item(
            outcome_for(index, scenario["oks"][index]),
            scenario["item_total"],
            scenario["flag_last"] and index == count - 1,
        )
        if was_done:
            assert transition is None
            late.add(index)
            assert fold.done is not None
            assert fold.done.late_indexes == tuple(sorted(late))
            continue
        assert transition is not None
        assert transition.rejected is None
        if index in seen:
            # a redelivery is merged once: only the duplicate count changes
            assert transition.state == replace(previous, duplicates=previous.duplicates + 1)
            assert transition.done is None
            assert transition.emits == ()
            continue
        seen.add(index)
        completing = seen == set(range(count))
        assert (transition.done is not None) == completing
        assert (transition.state is None) == completing
        assert len(transition.emits) == (1 if completing else 0)
        if not completing:
            assert transition.state is not None
            assert set(transition.state.received) == seen
    return fold


@PROPERTY
@given(scenarios())
def test_any_order_and_duplication_gives_one_result_equal_to_in_order_delivery(scenario: dict[str, Any]) -> None:
    count = scenario["count"]
    reference = run_scenario(scenario, list(range(count)))
    shuffled = run_scenario(scenario, scenario["deliveries"])

    assert len(reference.emits) == 1
    assert len(shuffled.emits) == 1
    assert shuffled.state is None
    assert shuffled.done is not None
    assert shuffled.done.status == "complete"
    assert without_times(shuffled.emits[0]) == without_times(reference.emits[0])

    result = shuffled.emits[0]
    assert result["status"] == "complete"
    assert result["expected_count"] == count
    assert result["missing"] == []
    assert result["failed"] == [index for index, ok in enumerate(scenario["oks"]) if not ok]
    assert [item["index"] for item in result["items"]] == list(range(count))
    for item, ok in zip(result["items"], scenario["oks"], strict=True):
        assert item["status"] == ("ok" if ok else "failed")
    expected_reason = "flag" if scenario["flag_last"] and "flag" in scenario["config"].complete_by else "count"
    assert result["reason"] == expected_reason


@PROPERTY
@given(
    st.lists(st.integers(min_value=0, max_value=50), max_size=60),
)
def test_late_items_are_counted_once_by_index(indexes: list[int]) -> None:
    done = DoneState(correlation_id="g", status="complete", completed_ms=5, expires_ms=600_005)
    for index in indexes:
        before = done
        done = on_late_item(done, index)
        if index in before.late_indexes:
            assert done is before
    assert done.late_indexes == tuple(sorted(set(indexes)))
    assert (done.correlation_id, done.status, done.completed_ms, done.expires_ms) == ("g", "complete", 5, 600_005)


# --------------------------------------------------------------------------------------------------------------
# Completion by count, by flag, and count-only configs.
# --------------------------------------------------------------------------------------------------------------


def test_completes_by_count_when_total_known() -> None:
    fold = Fold(config=BOTH)
    first = fold.item(outcome_for(2, True), total=3, last=False)
    assert first is not None
    assert first.state is not None
    assert first.state.expected_count == 3
    assert first.state.deadline_ms == first.state.opened_ms + BOTH.timeout_ms
    fold.item(outcome_for(0, True), total=3, last=False)
    assert fold.done is None
    final = fold.item(outcome_for(1, False), total=3, last=False)
    assert final is not None
    assert final.state is None
    assert final.done is not None
    assert final.done.status == "complete"
    assert final.done.completed_ms == fold.now
    assert final.done.expires_ms == fold.now + BOTH.done_retention_ms
    assert final.done.late_indexes == ()
    (result,) = final.emits
    assert result["reason"] == "count"
    assert result["aggregator"] == "agg"
    assert result["correlation_id"] == "group-1"
    assert result["failed"] == [1]
    assert result["items"][1] == {"index": 1, "status": "failed", "error": "ValueError: item 1 broke"}
    assert result["items"][0] == {"index": 0, "status": "ok", "result": {"value": 0}}


def test_completes_by_flag_when_total_unknown_only_once_lower_indexes_present() -> None:
    fold = Fold(config=FLAG_ONLY)
    flagged = fold.item(outcome_for(3, True), total=None, last=True)
    assert flagged is not None
    assert flagged.state is not None
    assert flagged.state.expected_count == 4  # index + 1
    assert flagged.state.last_index == 3
    for index in (1, 0):
        step = fold.item(outcome_for(index, True), total=None, last=False)
        assert step is not None
        assert step.done is None
    final = fold.item(outcome_for(2, True), total=None, last=False)
    assert final is not None
    assert final.done is not None
    (result,) = final.emits
    assert result["reason"] == "flag"
    assert result["expected_count"] == 4
    assert [item["index"] for item in result["items"]] == [0, 1, 2, 3]


def test_flag_on_index_zero_completes_a_single_item_group() -> None:
    transition = on_item(None, BOTH, "g", outcome_for(0, True), None, True, 10)
    assert transition.state is None
    assert transition.done is not None
    assert transition.emits[0]["expected_count"] == 1
    assert transition.emits[0]["reason"] == "flag"


def test_count_only_config_ignores_the_flag() -> None:
    fold = Fold(config=COUNT_ONLY)
    for index in (0, 1, 2):
        step = fold.item(outcome_for(index, True), total=None, last=index == 2)
        assert step is not None
        assert step.done is None
    assert fold.state is not None
    assert fold.state.expected_count is None
    assert fold.state.last_index == 2  # remembered, but not a completion criterion


def test_count_only_config_completes_by_count_even_when_flagged() -> None:
    fold = Fold(config=COUNT_ONLY)
    fold.item(outcome_for(1, True), total=2, last=True)
    final = fold.item(outcome_for(0, True), total=2, last=False)
    assert final is not None
    assert final.done is not None
    assert final.emits[0]["reason"] == "count"


def test_flag_only_config_ignores_total_on_items() -> None:
    fold = Fold(config=FLAG_ONLY)
    for index in (0, 1):
        step = fold.item(outcome_for(index, True), total=2, last=False)
        assert step is not None
        assert step.done is None
    assert fold.state is not None
    assert fold.state.expected_count is None


def test_flag_only_config_does_not_complete_by_an_opened_total() -> None:
    fold = Fold(config=FLAG_ONLY)
    fold.open(total=2, deadline_ms=10**9)
    fold.item(outcome_for(0, True), total=2, last=False)
    fold.item(outcome_for(1, True), total=2, last=False)
    assert fold.done is None
    assert fold.emits == []


# --------------------------------------------------------------------------------------------------------------
# on_open.
# --------------------------------------------------------------------------------------------------------------


def test_open_creates_group_and_repeat_changes_nothing() -> None:
    first = on_open(None, "g", 3, deadline_ms=9_000, now_ms=100, config=BOTH)
    assert first.state == GroupState(correlation_id="g", deadline_ms=9_000, opened_ms=100, expected_count=3)
    assert first.done is None
    assert first.emits == ()
    assert first.rejected is None
    again = on_open(first.state, "g", 3, deadline_ms=20_000, now_ms=200, config=BOTH)
    assert again.state is first.state


def test_open_after_items_learns_total_and_deadline() -> None:
    started = on_item(None, BOTH, "g", outcome_for(0, True), None, False, 100)
    assert started.state is not None
    opened = on_open(started.state, "g", 2, deadline_ms=7_000, now_ms=150, config=BOTH)
    assert opened.state is not None
    assert opened.state.expected_count == 2
    assert opened.state.deadline_ms == 7_000
    assert opened.state.opened_ms == 100
    assert opened.state.received == started.state.received
    final = on_item(opened.state, BOTH, "g", outcome_for(1, True), None, False, 200)
    assert final.done is not None
    assert final.emits[0]["opened_ms"] == 100


def test_open_deadline_is_used_by_expiry() -> None:
    state = on_open(None, "g", 2, deadline_ms=500, now_ms=100, config=BOTH).state
    assert on_expire(state, BOTH, 499).state is state
    assert on_expire(state, BOTH, 500).state is None


# --------------------------------------------------------------------------------------------------------------
# Timeout.
# --------------------------------------------------------------------------------------------------------------


def test_expire_of_no_group_is_a_no_op() -> None:
    assert on_expire(None, BOTH, 10**12) == GroupTransition(state=None)


def test_expire_before_deadline_keeps_state() -> None:
    state = on_item(None, BOTH, "g", outcome_for(1, True), 4, False, 1_000).state
    assert state is not None
    for now in (1_000, 3_000, state.deadline_ms - 1):
        transition = on_expire(state, BOTH, now)
        assert transition.state is state
        assert transition.done is None
        assert transition.emits == ()


@pytest.mark.parametrize("after", [0, 1, 60_000])
def test_expire_at_or_after_deadline_emits_partial_naming_missing(after: int) -> None:
    fold = Fold(config=BOTH)
    fold.item(outcome_for(1, True), total=5, last=False)
    fold.item(outcome_for(3, False), total=5, last=False)
    assert fold.state is not None
    now = fold.state.deadline_ms + after
    transition = on_expire(fold.state, BOTH, now)
    assert transition.state is None
    assert transition.done is not None
    assert transition.done.status == "partial"
    assert transition.done.completed_ms == now
    assert transition.done.expires_ms == now + BOTH.done_retention_ms
    (result,) = transition.emits
    assert result["status"] == "partial"
    assert result["reason"] == "timeout"
    assert result["missing"] == [0, 2, 4]
    assert result["failed"] == [3]
    assert result["completed_ms"] == now
    assert result["items"] == [
        {"index": 0, "status": "missing"},
        {"index": 1, "status": "ok", "result": {"value": 10}},
        {"index": 2, "status": "missing"},
        {"index": 3, "status": "failed", "error": "ValueError: item 3 broke"},
        {"index": 4, "status": "missing"},
    ]


def test_expire_with_unknown_total_names_gaps_below_highest_index() -> None:
    fold = Fold(config=BOTH)
    fold.item(outcome_for(4, True), total=None, last=False)
    fold.item(outcome_for(1, True), total=None, last=False)
    assert fold.state is not None
    result = on_expire(fold.state, BOTH, fold.state.deadline_ms).emits[0]
    assert result["expected_count"] is None
    assert result["missing"] == [0, 2, 3]
    assert [item["status"] for item in result["items"]] == ["missing", "ok", "missing", "missing", "ok"]


def test_expire_of_opened_group_with_no_items_names_every_index_missing() -> None:
    state = on_open(None, "g", 3, deadline_ms=100, now_ms=0, config=BOTH).state
    result = on_expire(state, BOTH, 100).emits[0]
    assert result["missing"] == [0, 1, 2]
    assert result["items"] == [{"index": i, "status": "missing"} for i in range(3)]
    assert result["failed"] == []


@PROPERTY
@given(
    count=st.integers(min_value=1, max_value=30),
    data=st.data(),
)
def test_expire_missing_is_exactly_the_absent_indexes(count: int, data: st.DataObject) -> None:
    present = data.draw(st.sets(st.integers(min_value=0, max_value=count - 1), max_size=count - 1))
    oks = data.draw(st.lists(st.booleans(), min_size=count, max_size=count))
    fold = Fold(config=BOTH)
    fold.open(count, deadline_ms=50_000)
    for index in data.draw(st.permutations(sorted(present))):
        fold.item(outcome_for(index, oks[index]), total=count, last=False)
    assert fold.done is None
    assert fold.state is not None
    kept = on_expire(fold.state, BOTH, 49_999)
    assert kept.state is fold.state
    result = on_expire(fold.state, BOTH, 50_000).emits[0]
    absent = [index for index in range(count) if index not in present]
    assert result["missing"] == absent
    assert [item["index"] for item in result["items"] if item["status"] == "missing"] == absent
    assert result["failed"] == sorted(index for index in present if not oks[index])
    for item in result["items"]:
        if item["index"] in present:
            assert item["status"] == ("ok" if oks[item["index"]] else "failed")


# --------------------------------------------------------------------------------------------------------------
# Rejections.
# --------------------------------------------------------------------------------------------------------------


def assert_rejected(transition: GroupTransition, before: GroupState, config: AggregatorConfig, index: int) -> str:
    assert transition.rejected is not None
    assert transition.state is before
    assert transition.done is None
    assert transition.emits == ()
    assert repr(config.name) in transition.rejected
    assert f"item {index} " in transition.rejected
    assert repr(before.correlation_id) in transition.rejected
    return transition.rejected


def open_group(config: AggregatorConfig, total: int | None, *indexes: int, last: int | None = None) -> GroupState:
    state: GroupState | None = None
    for index in indexes:
        transition = on_item(state, config, "order-42", outcome_for(index, True), total, index == last, 100)
        assert transition.rejected is None
        assert transition.done is None
        state = transition.state
    assert state is not None
    return state


def test_rejects_total_mismatch() -> None:
    before = open_group(BOTH, 4, 0)
    message = assert_rejected(on_item(before, BOTH, "order-42", outcome_for(1, True), 5, False, 200), before, BOTH, 1)
    assert "total 5" in message
    assert "expects 4" in message


def test_rejects_index_out_of_range() -> None:
    before = open_group(BOTH, 3, 0)
    message = assert_rejected(on_item(before, BOTH, "order-42", outcome_for(3, True), 3, False, 200), before, BOTH, 3)
    assert "out of range" in message


def test_rejects_index_out_of_range_after_flag() -> None:
    before = open_group(BOTH, None, 2, last=2)
    assert before.expected_count == 3
    assert_rejected(on_item(before, BOTH, "order-42", outcome_for(7, True), None, False, 200), before, BOTH, 7)


def test_rejects_negative_index_of_an_open_group() -> None:
    before = open_group(BOTH, 3, 0)
    message = assert_rejected(on_item(before, BOTH, "order-42", outcome_for(-1, True), 3, False, 200), before, BOTH, -1)
    assert "negative" in message


def test_rejects_two_different_items_flagged_last() -> None:
    before = open_group(COUNT_ONLY, 5, 1, last=1)
    message = assert_rejected(on_item(before, COUNT_ONLY, "order-42", outcome_for(3, True), 5, True, 200), before, COUNT_ONLY, 3)
    assert "flagged last" in message
    assert "item 1" in message


def test_rejects_a_lower_second_last_flag() -> None:
    before = open_group(BOTH, None, 0, 3, last=3)
    message = assert_rejected(on_item(before, BOTH, "order-42", outcome_for(1, True), None, True, 200), before, BOTH, 1)
    assert "flagged last" in message


def test_redelivered_flagged_item_is_not_a_conflict() -> None:
    before = open_group(BOTH, None, 3, last=3)
    transition = on_item(before, BOTH, "order-42", outcome_for(3, True), None, True, 200)
    assert transition.rejected is None
    assert transition.state == replace(before, duplicates=1)


def test_rejected_first_item_leaves_no_state() -> None:
    transition = on_item(None, BOTH, "order-42", outcome_for(-1, True), 3, False, 100)
    assert transition.rejected is not None
    assert transition.state is None


def test_rejects_first_item_out_of_range_of_its_own_total() -> None:
    transition = on_item(None, BOTH, "order-42", outcome_for(5, True), 3, False, 100)
    assert transition.rejected is not None
    assert "out of range" in transition.rejected


def test_last_flag_below_an_index_already_received_is_rejected() -> None:
    fold = Fold(config=BOTH)
    for index in (0, 3):
        fold.item(outcome_for(index, True), total=None, last=False)
    before = fold.state
    transition = on_item(before, BOTH, "g", outcome_for(1, True), None, True, 500)
    assert transition.rejected is not None
    assert "flagged last, but items [3]" in transition.rejected
    assert transition.state is before
    assert transition.emits == ()


# --------------------------------------------------------------------------------------------------------------
# Serialization round-trips.
# --------------------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@st.composite
def item_outcomes(draw: st.DrawFn, index: int) -> ItemOutcome:
    if draw(st.booleans()):
        return ItemOutcome(index=index, ok=True, result=draw(json_values))
    return ItemOutcome(index=index, ok=False, error=draw(st.text(max_size=20)))


@st.composite
def group_states(draw: st.DrawFn) -> GroupState:
    indexes = draw(st.sets(st.integers(min_value=0, max_value=40), max_size=15))
    received = {index: draw(item_outcomes(index)) for index in indexes}
    return GroupState(
        correlation_id=draw(st.text(max_size=20)),
        deadline_ms=draw(st.integers(min_value=0, max_value=2**53)),
        opened_ms=draw(st.integers(min_value=0, max_value=2**53)),
        expected_count=draw(st.none() | st.integers(min_value=1, max_value=50)),
        last_index=draw(st.none() | st.integers(min_value=0, max_value=49)),
        received=received,
    )


done_states = st.builds(
    DoneState,
    correlation_id=st.text(max_size=20),
    status=st.sampled_from(["complete", "partial"]),
    completed_ms=st.integers(min_value=0, max_value=2**53),
    expires_ms=st.integers(min_value=0, max_value=2**53),
    late_indexes=st.sets(st.integers(min_value=0, max_value=100)).map(lambda found: tuple(sorted(found))),
)


@ROUND_TRIP
@given(group_states())
def test_group_state_round_trips(state: GroupState) -> None:
    raw = state.to_dict()
    assert GroupState.from_dict(raw) == state
    assert GroupState.from_dict(json.loads(json.dumps(raw))) == state
    assert [item["index"] for item in raw["received"]] == sorted(state.received)


@ROUND_TRIP
@given(done_states)
def test_done_state_round_trips(done: DoneState) -> None:
    assert DoneState.from_dict(done.to_dict()) == done
    assert DoneState.from_dict(json.loads(json.dumps(done.to_dict()))) == done


@ROUND_TRIP
@given(st.integers(min_value=0, max_value=40).flatmap(item_outcomes))
def test_item_outcome_round_trips(outcome: ItemOutcome) -> None:
    assert ItemOutcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome


def test_group_state_from_minimal_dict_has_defaults() -> None:
    state = GroupState.from_dict({"correlation_id": "g", "deadline_ms": 5, "opened_ms": 1})
    assert state == GroupState(correlation_id="g", deadline_ms=5, opened_ms=1)
    assert DoneState.from_dict({"correlation_id": "g", "status": "partial", "completed_ms": 1, "expires_ms": 2}).late_indexes == ()


def test_round_tripped_state_continues_like_the_original() -> None:
    fold = Fold(config=BOTH)
    fold.item(outcome_for(0, True), total=2, last=False)
    assert fold.state is not None
    restored = GroupState.from_dict(json.loads(json.dumps(fold.state.to_dict())))
    direct = on_item(fold.state, BOTH, "group-1", outcome_for(1, False), 2, True, 50_000)
    via_table = on_item(restored, BOTH, "group-1", outcome_for(1, False), 2, True, 50_000)
    assert direct == via_table
    assert direct.done is not None


def test_merged_result_uses_the_clock_given() -> None:
    state = GroupState(correlation_id="g", deadline_ms=10, opened_ms=3, expected_count=1, received={0: outcome_for(0, True)})
    result = merged_result(state, BOTH, "complete", "count", 77)
    assert result["opened_ms"] == 3
    assert result["completed_ms"] == 77


# --------------------------------------------------------------------------------------------------------------
# Config validation and helpers.
# --------------------------------------------------------------------------------------------------------------


def test_config_defaults() -> None:
    config = AggregatorConfig(name="a", timeout_ms=1)
    assert config.complete_by == frozenset({"count", "flag"})
    assert config.done_retention_ms == 600_000


@pytest.mark.parametrize(
    "complete_by",
    [frozenset(), frozenset({"size"}), frozenset({"count", "eof"}), frozenset({"COUNT"})],
)
def test_config_rejects_bad_complete_by(complete_by: frozenset[str]) -> None:
    with pytest.raises(ValueError, match=r"aggregator 'bad': complete_by must be a non-empty subset"):
        AggregatorConfig(name="bad", timeout_ms=1_000, complete_by=complete_by)


@pytest.mark.parametrize("timeout_ms", [0, -1, -60_000])
def test_config_rejects_non_positive_timeout(timeout_ms: int) -> None:
    with pytest.raises(ValueError, match=rf"aggregator 'bad': timeout_ms must be a positive integer or None, got {timeout_ms}"):
        AggregatorConfig(name="bad", timeout_ms=timeout_ms)


@pytest.mark.parametrize("complete_by", [frozenset({"count"}), frozenset({"flag"}), frozenset({"count", "flag"})])
def test_config_accepts_valid_complete_by(complete_by: frozenset[str]) -> None:
    assert AggregatorConfig(name="ok", timeout_ms=1, complete_by=complete_by).complete_by == complete_by
