"""The aggregate stage's shell (app.aggregation.Aggregation) over plain dicts as its tables.

An outcome message is read once and folded in memory; a split of one chunk brings its open along. Whatever
the order and the redeliveries, a group completes once, with every item, and what comes after is counted late.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app import aggregation, metrics
from weir.app.aggregation import Aggregation, split_messages
from weir.app.errors import fitted_dead_letter
from weir.app.runtime import environment, keyed
from weir.app.runtime.keyed import Output
from weir.tables.aggregates import AggregatorConfig


def _stage(config: AggregatorConfig | None = None) -> tuple[Aggregation, list[Any], dict[str, Any]]:
    emitted: list[Any] = []
    tables: dict[str, Any] = {"open": {}, "done": {}, "deadlines": {}}

    class Results:
        """Stands in for the results topic: what is sent to it, decoded, beside the group's context."""

        context: Any = None

        def get_topic_name(self) -> str:
            return "results"

        async def send(self, *, key: bytes, value: bytes, headers: Any = None) -> None:
            result = orjson.loads(value)
            emitted.append((key.decode(), result, contexts.pop(0)))

    results = Results()
    contexts: list[Any] = []

    def outputs(event: Any, correlation_id: str, result: dict[str, Any], context: Any) -> list[Output]:
        contexts.append(context)
        return [Output(results, correlation_id, result)]  # type: ignore[arg-type]

    config = config or AggregatorConfig(name="t", timeout_ms=60_000, done_retention_ms=600_000)
    stage = Aggregation(
        agent="t",
        config=config,
        open_groups=tables["open"],  # type: ignore[arg-type]
        done_groups=tables["done"],  # type: ignore[arg-type]
        deadlines=tables["deadlines"],  # type: ignore[arg-type]
        outputs=outputs,
    )
    return stage, emitted, tables


def _event(partition: int = 0) -> Any:
    return SimpleNamespace(message=SimpleNamespace(partition=partition, topic="item-results", offset=0, key=b"k", headers=None))


def _outcomes(chunk: dict[str, Any]) -> dict[str, Any]:
    """What the item stage sends for a chunk whose items all succeed (result: the payload)."""
    results = [
        {"index": item["index"], "last": item["last"], "ok": True, "result": item["payload"], "error": None} for item in chunk["items"]
    ]
    message = {"kind": "items", "correlation_id": chunk["correlation_id"], "total": chunk["total"], "items": results}
    if "open" in chunk:
        message["open"] = chunk["open"]
    return message


def _deadline_entries(tables: dict[str, Any]) -> list[Any]:
    return [value for key, value in tables["deadlines"].items() if isinstance(value, list)]


def test_one_chunk_with_its_open_completes_in_one_message_and_files_no_group_deadline() -> None:
    stage, emitted, tables = _stage()
    opened, [chunk] = split_messages("o-1", ["a", "b", "c"], chunk=10, deadline_ms=10**13, context={"resume": 2})
    assert opened is None
    asyncio.run(stage.handle(_event(), _outcomes(chunk)))
    [(correlation_id, result, context)] = emitted
    assert (correlation_id, result["status"], context) == ("o-1", "complete", {"resume": 2})
    assert [item["result"] for item in result["items"]] == ["a", "b", "c"]
    assert tables["open"] == {}
    assert "o-1" in tables["done"]
    assert _deadline_entries(tables) == [["done", "o-1"]], "a group completed at once needs no deadline of its own"


def test_outcomes_after_the_one_that_completes_a_group_are_counted_late() -> None:
    stage, emitted, tables = _stage()
    message = {
        "kind": "items",
        "correlation_id": "o-2",
        "total": 2,
        "open": {"deadline_ms": 10**13},
        "items": [{"index": index, "ok": True, "result": index} for index in (0, 1, 1, 0)],
    }
    asyncio.run(stage.handle(_event(), message))
    assert len(emitted) == 1
    assert stage.late_items == 2
    assert tables["done"]["o-2"]["late_indexes"] == [0, 1]


@settings(max_examples=60, deadline=None)
@given(
    total=st.integers(1, 12),
    chunk=st.integers(1, 12),
    order=st.randoms(use_true_random=False),
    repeats=st.lists(st.integers(0, 20), max_size=6),
)
def test_any_order_with_redeliveries_completes_once_with_every_item(total: int, chunk: int, order: Any, repeats: list[int]) -> None:
    stage, emitted, _ = _stage()
    opened, chunks = split_messages("g", [f"p{index}" for index in range(total)], chunk=chunk, deadline_ms=10**13, context="ctx")
    messages = [_outcomes(each) for each in chunks]
    if opened is not None:
        messages.append(opened)
    messages += [messages[number % len(messages)] for number in repeats]  # redeliveries
    order.shuffle(messages)
    for message in messages:
        asyncio.run(stage.handle(_event(), message))
    [(correlation_id, result, context)] = emitted
    assert correlation_id == "g"
    assert result["status"] == "complete"
    assert [item["result"] for item in result["items"]] == [f"p{index}" for index in range(total)]
    if opened is None or messages.index(opened) == 0:
        assert context == "ctx", "the context comes from the open (folded into the only chunk, or first to arrive)"


def test_a_result_too_large_to_send_leaves_its_group_dead_lettered_and_an_outline_goes_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Completed by count and, for another group, by timeout: each too large, each handled for its own key alone."""
    letters: list[dict[str, Any]] = []

    async def record(letter: dict[str, Any]) -> None:
        letters.append(orjson.loads(fitted_dead_letter(letter, 50_000)))

    refused: list[tuple[str, Any, Any]] = []

    async def refuse(event: Any, *, reason: str, key: bytes | None = None, value: bytes | None = None, **_: Any) -> None:
        refused.append((reason, key.decode() if key else None, orjson.loads(value) if value else None))

    monkeypatch.setattr(keyed, "send_dead_letter_record", record)
    monkeypatch.setattr(keyed, "send_dead_letter", refuse)
    monkeypatch.setattr(keyed, "record_limit", lambda: 50_000)
    stage, emitted, tables = _stage()
    big = ["x" * 20_000] * 3  # a merged result of 60 KB, over the 50 KB limit
    _, [chunk] = split_messages("big", big, chunk=10, deadline_ms=10**13)
    _, [small] = split_messages("small", ["a"], chunk=10, deadline_ms=10**13)
    asyncio.run(stage.handle(_event(), _outcomes(chunk)))
    asyncio.run(stage.handle(_event(), _outcomes(small)))
    # A small open state whose result, listing 3,000 missing items, is over the limit: completed by its timeout.
    late = {"kind": "open", "correlation_id": "slow", "total": 3_000, "deadline_ms": 1_000}
    asyncio.run(stage.handle(_event(), late))
    asyncio.run(stage.handle(_event(), {"kind": "tick"}))  # the deadline (1 s after the epoch) has long passed
    # A group whose state would outgrow a record completes at once, too large, and what comes later is late.
    huge = {"kind": "open", "correlation_id": "huge", "total": 5, "deadline_ms": 10**13}
    asyncio.run(stage.handle(_event(), huge))
    items = [{"index": index, "ok": True, "result": "z" * 30_000} for index in range(2)]
    asyncio.run(stage.handle(_event(), {"kind": "items", "correlation_id": "huge", "total": 5, "items": items}))
    asyncio.run(stage.handle(_event(), {"kind": "item", "correlation_id": "huge", "total": 5, "index": 4, "ok": True}))
    by_group = {correlation_id: result for correlation_id, result, _ in emitted}
    assert by_group["small"]["status"] == "complete"
    for group, reason in (("big", "flag"), ("slow", "timeout"), ("huge", "too-large")):
        outline = by_group[group]
        assert (outline["status"], outline["reason"]) == ("dead-lettered", reason)
        assert outline["size_bytes"] > 50_000
        assert len(outline["sha256"]) == 64
        assert tables["done"][group]["status"] == "dead-lettered"
        assert "more than a record may hold" in tables["done"][group]["error"]
        assert group not in tables["open"]
    assert tables["done"]["huge"]["late_indexes"] == [4]
    # its result is in the dead letters, so no result will hold item 4: it is dead-lettered with its outcome
    assert refused == [("late", "huge", {"index": 4, "ok": True, "result": None, "error": None})]
    assert sorted(letter["key"]["text"] for letter in letters) == ["big", "huge", "slow"]
    assert all(letter["reason"] == "undeliverable" and letter["value"]["truncated"] for letter in letters)
    assert stage.keyed.undeliverable_count == 3


def test_a_tick_that_raises_once_still_completes_every_due_group_on_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expiry of one group raises on the first tick: the other due groups complete at once, that one on the next."""
    stage, emitted, tables = _stage()
    for group in ("a", "b", "c"):
        asyncio.run(stage.handle(_event(), {"kind": "open", "correlation_id": group, "total": 2, "deadline_ms": 1_000}))
    real_expire = aggregation.on_expire
    failed: list[str] = []

    def expire_failing_once(state: Any, config: Any, now_ms: int) -> Any:
        if state.correlation_id == "b" and not failed:
            failed.append("b")
            raise RuntimeError("the walk breaks on b")
        return real_expire(state, config, now_ms)

    monkeypatch.setattr(aggregation, "on_expire", expire_failing_once)
    asyncio.run(stage.handle(_event(), {"kind": "tick"}))
    assert sorted(correlation_id for correlation_id, _, _ in emitted) == ["a", "c"]
    assert "b" in tables["open"]
    asyncio.run(stage.handle(_event(), {"kind": "tick"}))
    assert sorted(correlation_id for correlation_id, _, _ in emitted) == ["a", "b", "c"]
    assert all(result["reason"] == "timeout" for _, result, _ in emitted)
    assert tables["open"] == {}


def test_a_flows_outline_is_made_from_the_result_not_from_the_resume_message_that_carries_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow's aggregate sends its result inside a resume message: the outline still names the group, its reason and size."""

    async def record(letter: dict[str, Any]) -> None:
        return None

    monkeypatch.setattr(keyed, "send_dead_letter_record", record)
    monkeypatch.setattr(keyed, "record_limit", lambda: 50_000)
    resumed: list[dict[str, Any]] = []

    class Resume:
        def get_topic_name(self) -> str:
            return "resume"

        async def send(self, *, key: bytes, value: bytes) -> None:
            resumed.append(orjson.loads(value))

    def outputs(event: Any, correlation_id: str, result: dict[str, Any], context: Any) -> list[Output]:
        return [Output(Resume(), correlation_id, {"exchange": {"payload": result}, "context": context})]  # type: ignore[arg-type]

    tables: dict[str, Any] = {"open": {}, "done": {}, "deadlines": {}}
    stage = Aggregation(
        agent="flow:f:agg",
        config=AggregatorConfig(name="agg", timeout_ms=60_000),
        open_groups=tables["open"],  # type: ignore[arg-type]
        done_groups=tables["done"],  # type: ignore[arg-type]
        deadlines=tables["deadlines"],  # type: ignore[arg-type]
        outputs=outputs,
    )
    _, [chunk] = split_messages("g-1", ["x" * 20_000] * 3, chunk=10, deadline_ms=10**13, context={"resume_step": 3})
    asyncio.run(stage.handle(_event(), _outcomes(chunk)))
    [message] = resumed
    outline = message["exchange"]["payload"]
    assert (outline["correlation_id"], outline["aggregator"], outline["status"], outline["reason"]) == (
        "g-1",
        "agg",
        "dead-lettered",
        "flag",
    )
    assert outline["size_bytes"] > 50_000
    assert message["context"] == {"resume_step": 3}, "the outline resumes the exchange the group's context names"


def _open_with_one_outcome(stage: Aggregation, correlation_id: str, partition: int = 0) -> None:
    """A group of 3 with item 1 in: open, not complete."""
    message = {"kind": "item", "correlation_id": correlation_id, "total": 3, "index": 1, "ok": True, "result": "b"}
    message["open"] = {"deadline_ms": None}
    asyncio.run(stage.handle(_event(partition), message))


def test_force_all_completes_the_open_groups_of_its_partition_only() -> None:
    from weir.app.kafka_io import key_partition

    outlet = environment.TopicOutlet(partitions={"item-results": 4})
    with environment.using(environment.Environment(clock=environment.WallClock(), outlet=outlet)):
        stage, emitted, tables = _stage(AggregatorConfig(name="t", timeout_ms=None))
        keys = [f"g-{number}" for number in range(12)]
        for key in keys:
            _open_with_one_outcome(stage, key, key_partition(key.encode(), 4))
        assert emitted == []
        forced = metrics.AGGREGATE_COMPLETIONS.labels("t", "partial", "forced")
        before = forced._value.get()
        asyncio.run(stage.handle(_event(2), aggregation.force_message("complete")))
        in_two = sorted(key for key in keys if key_partition(key.encode(), 4) == 2)
        assert forced._value.get() - before == len(in_two), "each forced completion is counted in the metrics"
        assert in_two, "the keys should spread over the partitions"
        assert sorted(key for key, _, _ in emitted) == in_two
        assert {(result["status"], result["reason"]) for _, result, _ in emitted} == {("partial", "forced")}
        assert all(result["missing"] == [0, 2] for _, result, _ in emitted)
        assert sorted(tables["open"]) == sorted(set(keys) - set(in_two))
        asyncio.run(stage.handle(_event(2), aggregation.force_message("complete")))
        assert len(emitted) == len(in_two), "a second force finds nothing open there: no second result"


def test_force_discard_of_one_group_sends_it_discarded_and_later_items_are_late() -> None:
    stage, emitted, tables = _stage()
    _open_with_one_outcome(stage, "o-9")
    _open_with_one_outcome(stage, "o-10")
    asyncio.run(stage.handle(_event(), aggregation.force_message("discard", "o-9")))
    [(key, result, _)] = emitted
    assert (key, result["status"], result["reason"]) == ("o-9", "discarded", "forced")
    assert tables["done"]["o-9"]["status"] == "discarded"
    assert "o-10" in tables["open"]
    late = {"kind": "item", "correlation_id": "o-9", "total": 3, "index": 0, "ok": True, "result": "a"}
    asyncio.run(stage.handle(_event(), late))
    assert tables["done"]["o-9"]["late_indexes"] == [0]
    assert len(emitted) == 1


@pytest.mark.parametrize("bad", [{"kind": "force", "action": "explode"}, {"kind": "force", "action": "complete", "correlation_id": 5}])
def test_a_bad_force_is_refused(bad: dict[str, Any]) -> None:
    stage, _, _ = _stage()
    with pytest.raises(aggregation.InvalidMessage):
        asyncio.run(stage.handle(_event(), bad))


def test_an_inactivity_deadline_files_one_entry_per_quiet_period_not_one_per_merge() -> None:
    """Each merge moves the inactivity deadline later; the entry filed at the open stands for it (the walk files
    it again at the group's real deadline), so merges write no deadline entries."""
    stage, _, tables = _stage(AggregatorConfig(name="t", timeout_ms=None, inactivity_ms=5_000))
    opened = {"kind": "open", "correlation_id": "q", "total": 5, "deadline_ms": None}
    asyncio.run(stage.handle(_event(), opened))
    entries = _deadline_entries(tables)
    assert entries == [["group", "q"]]
    for index in range(4):
        item = {"kind": "item", "correlation_id": "q", "total": 5, "index": index, "ok": True, "result": index}
        asyncio.run(stage.handle(_event(), item))
    assert _deadline_entries(tables) == entries
    assert tables["open"]["q"]["updated_ms"] >= tables["open"]["q"]["opened_ms"]
