"""What a split sends (app.aggregation.split_messages) and what the item stage hands on (ItemWorker)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson

from weir.app.aggregation import ItemWorker, split_messages
from weir.app.errors import StepOutcome


def test_items_that_fit_one_chunk_carry_their_open_and_no_open_is_sent_apart() -> None:
    opened, chunks = split_messages("o-1", ["a", "b", "c"], chunk=10, deadline_ms=5_000, context={"resume": 4})
    assert opened is None
    [chunk] = chunks
    assert chunk["open"] == {"deadline_ms": 5_000, "context": {"resume": 4}}
    assert [item["index"] for item in chunk["items"]] == [0, 1, 2]
    assert [item["last"] for item in chunk["items"]] == [False, False, True]


def test_items_over_several_chunks_get_an_open_of_their_own_and_chunks_carry_none() -> None:
    opened, chunks = split_messages("o-2", list(range(5)), chunk=2, deadline_ms=7_000)
    assert opened == {"kind": "open", "correlation_id": "o-2", "total": 5, "deadline_ms": 7_000}
    assert [[item["index"] for item in chunk["items"]] for chunk in chunks] == [[0, 1], [2, 3], [4]]
    assert all("open" not in chunk for chunk in chunks)


class _Results:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def get_topic_name(self) -> str:
        return "results"

    async def send(self, *, key: bytes, value: bytes) -> None:
        self.sent.append((key, orjson.loads(value)))


def _outcomes(message: dict[str, Any]) -> list[Any]:
    async def step(payload: Any, index: int, raw: dict[str, Any]) -> StepOutcome:
        return StepOutcome(ok=True, value=payload * 2, error=None, attempts=1)

    results = _Results()
    worker = ItemWorker(agent="items", step=step, results=results, concurrent=False, concurrency=1)  # type: ignore[arg-type]
    event = SimpleNamespace(message=SimpleNamespace(value=orjson.dumps(message)))
    asyncio.run(worker.handle_part([event], what="items"))  # type: ignore[list-item]
    return results.sent


def test_the_item_stage_hands_a_folded_open_on_with_the_outcomes() -> None:
    _, [chunk] = split_messages("o-3", [1, 2], chunk=10, deadline_ms=9_000, context={"c": 1})
    [(key, message)] = _outcomes(chunk)
    assert key == b"o-3"
    assert message["kind"] == "items"
    assert message["open"] == {"deadline_ms": 9_000, "context": {"c": 1}}
    assert [outcome["result"] for outcome in message["items"]] == [2, 4]


def test_the_item_stage_adds_no_open_to_a_chunk_that_had_none() -> None:
    _, chunks = split_messages("o-4", [1, 2, 3], chunk=2, deadline_ms=9_000)
    for chunk in chunks:
        [(_, message)] = _outcomes(chunk)
        assert "open" not in message
