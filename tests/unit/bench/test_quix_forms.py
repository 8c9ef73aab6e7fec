"""bench.quix_split_aggregate's forms give weir's aggregate for the same order, and bench._util checks it against the catalogue."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import quix_split_aggregate as quix
from bench._util import FLAVOURS, expected_total_cents, order, result_problem
from weir.app.pipeline import aggregator_config
from weir.app.settings import Settings
from weir.tables.aggregates import ItemOutcome, complete_at_once

AGGREGATOR = aggregator_config(Settings())

#: The fields of a result that say what the order came to (the clock's fields left out).
_RESULT_FIELDS = ("correlation_id", "aggregator", "status", "reason", "expected_count", "items", "missing", "failed")
NOW_MS = 1_764_450_000_000


def _weir(order_value: dict[str, Any]) -> dict[str, Any]:
    """weir's aggregator core on the order's outcomes (what its aggregate stage and its inline splitter emit)."""
    items = order_value["items"]
    outcomes = []
    for index, payload in enumerate(items):
        outcome = quix.outcome_of(index, payload, len(items))
        outcomes.append((ItemOutcome(index=index, ok=outcome["ok"], result=outcome["result"], error=outcome["error"]), outcome["last"]))
    transition = complete_at_once(
        aggregator_config(Settings()), order_value["order_id"], len(items), outcomes, deadline_ms=None, now_ms=NOW_MS
    )
    [result] = transition.emits
    return result


def _fields(result: dict[str, Any]) -> dict[str, Any]:
    return {field: result[field] for field in _RESULT_FIELDS}


def _three_stages(order_value: dict[str, Any], chunk: int, arrival: list[int]) -> list[dict[str, Any]]:
    """Split, price each chunk, merge them in the ``arrival`` order (indexes into the chunks, repeats allowed): the results."""
    chunks = [quix.price_chunk(message) for message in quix.chunks_of(order_value, chunk)]
    received: dict[str, dict[str, Any]] | None = None
    results = []
    for number in arrival:
        received, result = quix.merge_outcomes(received, chunks[number % len(chunks)], NOW_MS)
        if result is not None:
            results.append(result)
    return results


items_of = st.lists(
    st.one_of(
        st.builds(lambda flavour, scoops: {"flavour": flavour, "scoops": scoops}, st.sampled_from(FLAVOURS), st.integers(1, 3)),
        st.just({"flavour": "durian", "scoops": 1}),
        st.just({"flavour": "mint", "scoops": 0}),
    ),
    min_size=1,
    max_size=25,
)


@given(items_of, st.integers(1, 12), st.randoms(use_true_random=False))
def test_every_form_gives_weirs_aggregate_for_the_same_order(items: list[dict[str, Any]], chunk: int, rng: Any) -> None:
    order_value = {"order_id": "o-7", "items": items}
    expected = _fields(_weir(order_value))
    assert _fields(quix.price_order(order_value, NOW_MS)) == expected
    for size in (chunk, 1):  # chunks, and the per-item form
        count = len(quix.chunks_of(order_value, size))
        arrival = list(range(count))
        rng.shuffle(arrival)
        [merged] = _three_stages(order_value, size, arrival)
        assert _fields(merged) == expected


def test_chunks_carry_consecutive_indexes_and_are_keyed_by_their_first() -> None:
    order_value = {"order_id": "o-1", "items": [{"flavour": "mint", "scoops": 1}] * 25}
    chunks = quix.chunks_of(order_value, 10)
    assert [[item["index"] for item in chunk["items"]] for chunk in chunks] == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    assert [quix.chunk_key(chunk) for chunk in chunks] == ["o-1#0", "o-1#10", "o-1#20"]
    assert {chunk["total"] for chunk in chunks} == {25}


def test_a_redelivered_chunk_is_merged_once() -> None:
    order_value = {"order_id": "o-2", "items": [{"flavour": "lemon", "scoops": 2}] * 4}
    first, second = (quix.price_chunk(chunk) for chunk in quix.chunks_of(order_value, 2))
    received, result = quix.merge_outcomes(None, first, NOW_MS)
    received, again = quix.merge_outcomes(received, first, NOW_MS)
    assert (result, again) == (None, None)
    assert sorted(received) == ["0", "1"]
    _, result = quix.merge_outcomes(received, second, NOW_MS)
    assert result is not None
    assert _fields(result) == _fields(_weir(order_value))


def test_the_bench_orders_results_check_against_their_catalogue_total() -> None:
    for number in (0, 1, 5, 123):
        order_value = orjson.loads(order(number, 10))
        total = sum(item["result"]["price_cents"] for item in _weir(order_value)["items"])
        assert total == expected_total_cents(number, 10)
        for result in (_weir(order_value), quix.price_order(order_value), *_three_stages(order_value, 10, [0])):
            assert result_problem(f"b-{number}", orjson.loads(orjson.dumps(result)), 10) is None


def test_a_wrong_result_is_named_with_its_order() -> None:
    result = quix.price_order(orjson.loads(order(3, 10)), NOW_MS)
    result["items"][4]["result"]["price_cents"] += 1
    assert "result of order 'b-3': its items' price_cents add up to" in (result_problem("b-3", result, 10) or "")
    result["items"].pop()
    assert "expected items with indexes 0..9" in (result_problem("b-3", result, 10) or "")
    assert "expected status 'complete'" in (result_problem("b-3", {"status": "partial", "expected_count": 10}, 10) or "")
    assert "expected a JSON object" in (result_problem("b-3", [1], 10) or "")


def test_an_unknown_form_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_QUIX_FORM", "two-stages")
    with pytest.raises(ValueError, match=re.escape("BENCH_QUIX_FORM='two-stages', expected one of ['inline', 'chunks', 'per-item']")):
        quix.form()
