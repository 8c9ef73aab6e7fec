"""on_items: a message's item outcomes merged in one step are the aggregate stage's fold of on_item over them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from weir.tables.aggregates import (
    COMPLETE_BY_COUNT,
    COMPLETE_BY_FLAG,
    STOP_ON_FAILURE,
    AggregatorConfig,
    GroupState,
    GroupTransition,
    ItemOutcome,
    on_item,
    on_items,
    on_open,
)

NOW = 1_000
CONFIGS = [
    AggregatorConfig(name="both", timeout_ms=5_000),
    AggregatorConfig(name="flag-only", timeout_ms=None, complete_by=frozenset({COMPLETE_BY_FLAG})),
    AggregatorConfig(name="count-only", timeout_ms=None, complete_by=frozenset({COMPLETE_BY_COUNT})),
    AggregatorConfig(name="stop", timeout_ms=5_000, on_item_failure=STOP_ON_FAILURE),
]

Outcomes = list[tuple[ItemOutcome, bool]]


def fold(
    state: GroupState | None, config: AggregatorConfig, outcomes: Outcomes, total: int | None
) -> tuple[GroupTransition, tuple[str, ...], int]:
    """on_item on each outcome in turn, as the aggregate stage merged a message before on_items: refusals are
    collected and skipped, and the outcome that completes the group ends the merge."""
    rejected: list[str] = []
    transition = GroupTransition(state=state)
    for position, (outcome, last) in enumerate(outcomes):
        step = on_item(state, config, "g-1", outcome, total, last, NOW)
        if step.rejected is not None:
            rejected.append(step.rejected)
            continue
        if step.done is not None:
            return step, tuple(rejected), position + 1
        state = step.state
        transition = GroupTransition(state=state)
    return transition, tuple(rejected), len(outcomes)


def _outcome(index: int, ok: bool) -> ItemOutcome:
    return ItemOutcome(index=index, ok=ok, result={"i": index} if ok else None, error=None if ok else f"e{index}")


outcome_lists = st.lists(st.tuples(st.integers(-1, 7), st.booleans(), st.booleans()), max_size=12).map(
    lambda raw: [(_outcome(index, ok), last) for index, ok, last in raw]
)


@st.composite
def groups(draw: st.DrawFn) -> tuple[AggregatorConfig, GroupState | None, int | None]:
    """A config, the group before the message (none, just opened, or with outcomes merged already), and the total
    the message's outcomes carry (sometimes none, sometimes one that disagrees with the group's)."""
    config = draw(st.sampled_from(CONFIGS))
    total = draw(st.sampled_from([None, 1, 3, 5, 6]))
    state: GroupState | None = None
    kind = draw(st.sampled_from(["none", "opened", "merged"]))
    if kind != "none":
        state = on_open(None, "g-1", draw(st.sampled_from([None, 3, 5, 6])), 5_000, 0, config=config).state
    if kind == "merged":
        state, _, _ = fold(state, config, draw(outcome_lists), total)
        state = state.state if state.done is None else None
    return config, state, total


@given(groups(), outcome_lists)
def test_merging_a_messages_outcomes_at_once_is_the_fold_of_on_item(
    group: tuple[AggregatorConfig, GroupState | None, int | None], outcomes: Outcomes
) -> None:
    config, state, total = group
    assert on_items(state, config, "g-1", outcomes, total, NOW) == fold(state, config, outcomes, total)


def test_a_message_of_duplicates_only_counts_them_and_leaves_the_group_as_it_was() -> None:
    config = CONFIGS[0]
    opened = on_open(None, "g-1", 3, 5_000, 0, config=config).state
    assert opened is not None
    merged, _, _ = on_items(opened, config, "g-1", [(_outcome(0, True), False)], 3, NOW)
    assert merged.state is not None
    again, rejected, taken = on_items(merged.state, config, "g-1", [(_outcome(0, False), False), (_outcome(0, True), False)], 3, NOW + 5)
    assert (rejected, taken) == ((), 2)
    assert again.state == replace(merged.state, duplicates=2), "counted, not merged, and not a merge: updated_ms stays"
