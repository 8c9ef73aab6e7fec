"""Items inline (WEIR_ITEMS_INLINE): the splitter runs the item step and sends the order's result itself.

Its result must be the one the three-stage pipeline's aggregate stage makes for the same outcomes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.aggregate.test_aggregation_shell import _stage
from tests.unit.aggregate.test_on_items import fold
from weir import Settings, TestDriver
from weir.app.aggregation import split_messages
from weir.app.pipeline import aggregator_config
from weir.tables.aggregates import (
    COMPLETE_BY_COUNT,
    COMPLETE_BY_FLAG,
    AggregatorConfig,
    GroupTransition,
    ItemOutcome,
    complete_at_once,
    inline_result,
    on_open,
)

ROOT = Path(__file__).resolve().parents[3]
AGGREGATOR = aggregator_config(Settings())

_RESULT_FIELDS = ("correlation_id", "status", "reason", "expected_count", "items", "missing", "failed")


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 99)), min_size=1, max_size=15))
def test_a_group_completed_at_once_gets_the_result_the_aggregate_stage_makes(items: list[tuple[bool, int]]) -> None:
    total = len(items)
    outcomes = [
        (ItemOutcome(index=index, ok=ok, result={"v": value} if ok else None, error=None if ok else f"e{value}"), index == total - 1)
        for index, (ok, value) in enumerate(items)
    ]
    transition = complete_at_once(AGGREGATOR, "o-1", total, outcomes, deadline_ms=10**13, now_ms=1_000)
    [inline] = transition.emits

    stage, emitted, _ = _stage()
    stage.config = AGGREGATOR
    _, [chunk] = split_messages("o-1", [value for _, value in items], chunk=total, deadline_ms=10**13)
    reported = [{"index": o.index, "last": last, "ok": o.ok, "result": o.result, "error": o.error, "attempts": 1} for o, last in outcomes]
    message = {"kind": "items", "correlation_id": "o-1", "total": total, "items": reported, "open": chunk["open"]}
    asyncio.run(stage.handle(SimpleNamespace(message=SimpleNamespace(partition=0)), message))
    [(_, staged, _)] = emitted
    assert {field: inline[field] for field in _RESULT_FIELDS} == {field: staged[field] for field in _RESULT_FIELDS}


def _upper_or_fail(payload: Any) -> Any:
    if payload == "boom":
        raise ValueError("boom")
    return payload.upper()


@pytest.mark.parametrize("inline", [True, False])
def test_the_splitter_inline_sends_each_orders_result_and_dead_letters_a_bad_order_and_a_failed_item_alone(inline: bool) -> None:
    """Inline or through the items and aggregate stages, every order gets its one result, a bad order too."""
    settings = Settings(partitions=2, items_inline=inline, retry_attempts=3)
    with TestDriver(settings=settings, item_step=_upper_or_fail) as driver:
        for order in ({"order_id": "o-1", "items": ["a", "b"]}, {"order_id": "bad"}, {"order_id": "o-2", "items": ["c", "boom", "d"]}):
            driver.pipe("orders", order, key=str(order["order_id"]))
        sent = {record.key: record.value for record in driver.read("aggregates")}
        dead = driver.dead_letters()
    assert sorted(sent) == ["bad", "o-1", "o-2"], "every order gets its one result, a bad one too"
    assert (sent["bad"]["status"], sent["bad"]["reason"]) == ("invalid", "invalid")
    assert (sent["o-1"]["status"], [item["result"] for item in sent["o-1"]["items"]]) == ("complete", ["A", "B"])
    assert sent["o-2"]["status"] == "complete"
    assert sent["o-2"]["failed"] == [1]
    assert [item["status"] for item in sent["o-2"]["items"]] == ["ok", "failed", "ok"]
    assert [(letter["reason"], letter["step"], letter["agent"]) for letter in dead] == [
        ("invalid", "validate", "splitter"),
        ("failed", "process", "splitter" if inline else "items"),
    ]
    assert orjson.loads(dead[1]["value"]["text"])["payload"] == "boom", "the failed item's dead letter holds that item alone"


def test_items_inline_refuses_to_start_under_at_least_once() -> None:
    env = {
        **os.environ,
        "WEIR_AGENTS": "splitter",
        "WEIR_ITEMS_INLINE": "1",
        "WEIR_GUARANTEE": "at_least_once",
        "WEIR_DATA_DIR": str(ROOT / ".weir" / "unit-inline"),
    }
    done = subprocess.run([sys.executable, "-c", "import weir.app.main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "WEIR_ITEMS_INLINE=1 needs WEIR_GUARANTEE=exactly_once" in done.stderr


_configs = st.sampled_from(
    [
        AGGREGATOR,
        AggregatorConfig(name="flag-only", timeout_ms=None, complete_by=frozenset({COMPLETE_BY_FLAG})),
        AggregatorConfig(name="count-only", timeout_ms=None, complete_by=frozenset({COMPLETE_BY_COUNT})),
    ]
)


@st.composite
def _arrivals(draw: st.DrawFn) -> tuple[int, list[tuple[ItemOutcome, bool]]]:
    """Outcomes as the inline path has them (every index once, the highest flagged last), or disturbed: shuffled,
    repeated, missing, out of range, flagged last elsewhere or twice."""
    total = draw(st.integers(1, 8))
    indexes = list(range(total))
    if draw(st.booleans()):
        indexes = draw(st.permutations(indexes))
    if draw(st.booleans()):
        indexes = draw(st.lists(st.integers(-1, total + 1), min_size=0, max_size=total + 2))
    flags = draw(st.sampled_from(["highest", "none", "random"]))
    outcomes = []
    for index in indexes:
        ok = draw(st.booleans())
        last = index == total - 1 if flags == "highest" else False if flags == "none" else draw(st.booleans())
        outcomes.append((ItemOutcome(index=index, ok=ok, result={"i": index} if ok else None, error=None if ok else "e"), last))
    return total, outcomes


def _folded(config: AggregatorConfig, total: int, outcomes: list[tuple[ItemOutcome, bool]]) -> GroupTransition:
    """What the aggregate stage does with these outcomes after the open (tests/unit/aggregate/test_on_items.py's
    fold of on_item); the first refusal named when they did not complete the group."""
    opened = on_open(None, "o-1", total, 10**13, 1_000, config=config).state
    transition, rejected, _ = fold(opened, config, outcomes, total)
    return replace(transition, rejected=rejected[0]) if rejected and transition.done is None else transition


@given(_configs, _arrivals())
def test_completing_at_once_is_the_aggregate_stages_fold_in_one_step(
    config: AggregatorConfig, arrivals: tuple[int, list[tuple[ItemOutcome, bool]]]
) -> None:
    total, outcomes = arrivals
    assert complete_at_once(config, "o-1", total, outcomes, 10**13, 1_000) == _folded(config, total, outcomes)


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 99)), min_size=1, max_size=25),
    st.sampled_from([frozenset({COMPLETE_BY_COUNT}), frozenset({COMPLETE_BY_FLAG}), frozenset({COMPLETE_BY_COUNT, COMPLETE_BY_FLAG})]),
    st.one_of(st.none(), st.integers(1, 10**6)),
)
def test_the_inline_result_is_the_one_completing_at_once_makes(
    items: list[tuple[bool, int]], complete_by: frozenset[str], timeout_ms: int | None
) -> None:
    """inline_result builds in one pass what the stage's transitions give for items 0..n-1 in order, the last flagged."""
    config = AggregatorConfig(name="agg", timeout_ms=timeout_ms, complete_by=complete_by)
    total = len(items)
    now = 5_000
    deadline_ms = config.deadline_from(now)
    outcomes = [
        (ItemOutcome(index=index, ok=ok, result={"v": value} if ok else None, error=None if ok else f"e{value}"), index == total - 1)
        for index, (ok, value) in enumerate(items)
    ]
    [expected] = complete_at_once(config, "o-1", total, outcomes, deadline_ms, now).emits
    made = inline_result(config, "o-1", [(outcome.ok, outcome.result, outcome.error) for outcome, _ in outcomes], deadline_ms, now)
    assert made == expected
    assert orjson.dumps(made) == orjson.dumps(expected), "the same bytes on the topic too (the same key order)"


def test_the_splitter_inline_runs_a_part_s_orders_at_once_with_an_async_step_and_in_order_with_a_sync_one() -> None:
    """An async step may wait on I/O: a part's orders run at once (here each order's one item waits for the other's).
    A sync step tried in place runs each order to its end: one after the other, in their order, no task each."""
    started: list[str] = []
    gate = asyncio.Event()

    async def waits_for_the_other(payload: Any) -> Any:
        started.append(payload)
        if len(started) == 2:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)  # sequential orders would time out here
        return payload.upper()

    def in_order(payload: Any) -> Any:
        started.append(payload)
        return payload.upper()

    for step in (waits_for_the_other, in_order):
        started.clear()
        gate = asyncio.Event()
        with TestDriver(settings=Settings(partitions=1, items_inline=True, retry_attempts=1), item_step=step) as driver:
            for n in range(2):  # one part: both records written, then read in one batch
                driver.pipe("orders", {"order_id": f"o-{n}", "items": [f"x{n}"]}, key=f"o-{n}", run=False)
            driver.run()
            results = {record.key: record.value for record in driver.read("aggregates")}
        items = {key: [(item["status"], item.get("result")) for item in result["items"]] for key, result in results.items()}
        assert items == {"o-0": [("ok", "X0")], "o-1": [("ok", "X1")]}, step
        assert started == ["x0", "x1"], started
