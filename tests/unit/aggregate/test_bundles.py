"""Bundles: a batch's messages to one partition in one record (app.aggregation.send_bundled).

The splitter bundles a batch's item chunks by items partition, an items worker its outcome messages by
aggregator partition; each stage handles each message of a bundle alone.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.aggregate.test_aggregation_shell import _outcomes, _stage
from weir import Settings, TestDriver
from weir.app import aggregation, shell
from weir.app.aggregation import ItemWorker, send_bundled, split_messages
from weir.app.errors import StepOutcome
from weir.app.kafka_io import key_partition
from weir.app.runtime import environment


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes, Any, int | None]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes, value: bytes, partition: int | None = None) -> None:
        self.sent.append((key, orjson.loads(value), partition))


#: The outlet of this module's tests: each topic's own send, the partition counts a test sets (a worker's come from the broker).
OUTLET = environment.TopicOutlet()


@pytest.fixture(scope="module", autouse=True)
def _outlet() -> Iterator[None]:
    environment.install(environment.Environment(clock=environment.WallClock(), outlet=OUTLET))
    yield
    environment.install(environment.STANDALONE)


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_a_key_goes_where_the_producers_default_partitioner_puts_it(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert key_partition(key, partitions) == DefaultPartitioner()(key, every, every)


@given(st.lists(st.integers(0, 400), min_size=0, max_size=60), st.integers(1, 8), st.integers(1, 12))
def test_each_bundle_holds_messages_of_one_partition_and_each_message_goes_once(numbers: list[int], partitions: int, size: int) -> None:
    topic = _Topic("results")
    OUTLET.counts["results"] = partitions
    outgoing = [
        (f"o-{number}", orjson.dumps({"kind": "item", "correlation_id": f"o-{number}", "n": n})) for n, number in enumerate(numbers)
    ]
    asyncio.run(send_bundled(topic, outgoing, size=size))  # type: ignore[arg-type]
    delivered: list[tuple[str, int]] = []
    for key, value, partition in topic.sent:
        messages = value["messages"] if value["kind"] == "bundle" else [value]
        assert len(messages) <= max(size, 1)
        if value["kind"] == "bundle":
            assert len(messages) > 1, "a bundle of one is sent as the message itself"
            assert key == messages[0]["correlation_id"].encode(), "keyed by its first message"
        target = partition if partition is not None else key_partition(key, partitions)
        for message in messages:
            assert key_partition(message["correlation_id"].encode(), partitions) == target, "a message leaves its key's partition"
            delivered.append((message["correlation_id"], message["n"]))
    assert Counter(delivered) == Counter((key, orjson.loads(value)["n"]) for key, value in outgoing)


@given(st.lists(st.integers(0, 300), min_size=2, max_size=40), st.integers(200, 2_000))
def test_a_bundle_stays_within_the_record_limit_and_a_larger_message_goes_alone(padding: list[int], limit: int) -> None:
    topic = _Topic("results")
    OUTLET.counts["results"] = 2
    outgoing = [(f"o-{n}", orjson.dumps({"correlation_id": f"o-{n}", "pad": "x" * pad})) for n, pad in enumerate(padding)]
    with mock.patch.object(aggregation, "record_limit", return_value=limit):
        asyncio.run(send_bundled(topic, outgoing, size=50))  # type: ignore[arg-type]
    delivered = []
    for _, value, _ in topic.sent:
        size = len(orjson.dumps(value))
        if value.get("kind") == "bundle":
            assert size <= limit, f"a bundle of {size} bytes, over the limit of {limit}"
            delivered += [message["correlation_id"] for message in value["messages"]]
        else:
            delivered.append(value["correlation_id"])
    assert sorted(delivered) == sorted(key for key, _ in outgoing)


def test_no_bundles_when_the_partition_count_is_unknown_or_size_is_one() -> None:
    outgoing = [(f"o-{number}", orjson.dumps({"kind": "item", "correlation_id": f"o-{number}"})) for number in range(20)]
    for name, size in (("unknown", 50), ("results", 1)):
        OUTLET.counts["results"] = 4
        topic = _Topic(name)
        asyncio.run(send_bundled(topic, outgoing, size=size))  # type: ignore[arg-type]
        assert [value["kind"] for _, value, _ in topic.sent] == ["item"] * 20
        assert all(partition is None for _, _, partition in topic.sent)


def test_the_aggregator_handles_each_message_of_a_bundle_and_dead_letters_a_bad_one_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    stage, emitted, _ = _stage()
    dead: list[Any] = []

    async def dead_letter(event: Any, *, reason: str, error: str, agent: str, step: str, **_: Any) -> None:
        dead.append((reason, step, shell._handled_part.get()))

    monkeypatch.setattr(aggregation, "send_dead_letter", dead_letter)
    monkeypatch.setattr(shell, "send_dead_letter", dead_letter)  # core.dead_lettered sends the bad message's
    _, [first] = split_messages("o-1", ["a"], chunk=10, deadline_ms=10**13)
    _, [second] = split_messages("o-2", ["b", "c"], chunk=10, deadline_ms=10**13)
    bad = {"kind": "items", "correlation_id": "o-3", "total": 1, "items": "not a list"}
    bundle = {"kind": "bundle", "messages": [_outcomes(first), bad, _outcomes(second)]}
    asyncio.run(stage.handle(SimpleNamespace(message=SimpleNamespace(partition=0)), bundle))
    assert sorted((correlation_id, result["status"]) for correlation_id, result, _ in emitted) == [("o-1", "complete"), ("o-2", "complete")]
    assert dead == [("invalid", "validate", bad)], "the dead letter holds the bad message, not the bundle"


def test_a_dead_letter_inside_dead_letter_value_holds_the_part(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []

    class _DeadLetters:
        async def send(self, *, key: bytes, value: bytes) -> None:
            sent.append(orjson.loads(value))

    monkeypatch.setattr(OUTLET, "dead_letters", _DeadLetters())
    message = SimpleNamespace(topic="t", partition=0, offset=7, key=b"k", value=b'{"kind": "bundle"}', headers=[])
    event: Any = SimpleNamespace(message=message)
    with shell.dead_letter_value({"part": 1}):
        asyncio.run(shell.send_dead_letter(event, reason="invalid", error="e", agent="a", step="s"))
    asyncio.run(shell.send_dead_letter(event, reason="invalid", error="e", agent="a", step="s"))
    assert [orjson.loads(record["value"]["text"]) for record in sent] == [{"part": 1}, {"kind": "bundle"}]


def _event(value: Any, offset: int = 0) -> Any:
    return SimpleNamespace(message=SimpleNamespace(topic="t", partition=0, offset=offset, key=b"k", value=orjson.dumps(value), headers=[]))


def _dead_letters(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    dead: list[Any] = []

    async def dead_letter(event: Any, *, reason: str, error: str, agent: str, step: str, value: bytes | None = None, **_: Any) -> None:
        dead.append((reason, step, orjson.loads(value) if value is not None else shell._handled_part.get()))

    monkeypatch.setattr(aggregation, "send_dead_letter", dead_letter)
    monkeypatch.setattr(shell, "send_dead_letter", dead_letter)
    return dead


@pytest.mark.parametrize("concurrent", [False, True])
def test_an_items_worker_handles_each_message_of_a_bundle_and_dead_letters_a_bad_one_alone(
    monkeypatch: pytest.MonkeyPatch, concurrent: bool
) -> None:
    dead = _dead_letters(monkeypatch)

    async def step(payload: Any, index: int, raw: dict[str, Any]) -> StepOutcome:
        await asyncio.sleep(0)
        return StepOutcome(ok=True, value=payload.upper(), error=None, attempts=1)

    results = _Topic("results")
    OUTLET.counts["results"] = 1
    worker = ItemWorker(agent="items", step=step, results=results, concurrent=concurrent, concurrency=4, bundle=50)  # type: ignore[arg-type]
    _, [first] = split_messages("o-1", ["a"], chunk=10, deadline_ms=10**13)
    _, [second] = split_messages("o-2", ["b", "c"], chunk=10, deadline_ms=10**13)
    bad = {"correlation_id": "o-3", "items": "not a list"}
    plain = split_messages("o-4", ["d"], chunk=10, deadline_ms=10**13)[1][0]
    events = [_event({"kind": "bundle", "messages": [first, bad, second]}, 0), _event(plain, 1)]
    asyncio.run(worker.handle_part(events, what="items: item"))
    [(_, value, partition)] = results.sent
    assert (value["kind"], partition) == ("bundle", 0), "the outcomes of one part go out in one record per partition"
    outcomes = {message["correlation_id"]: [item["result"] for item in message.get("items", [message])] for message in value["messages"]}
    assert outcomes == {"o-1": ["A"], "o-2": ["B", "C"], "o-4": ["D"]}
    assert [(reason, step) for reason, step, _ in dead] == [("invalid", "validate")]
    assert dead[0][2] == bad, "the dead letter holds the bad message, not the bundle"


def test_the_splitter_bundles_a_parts_chunks_by_items_partition_and_dead_letters_a_bad_order_alone() -> None:
    """The splitter's part (the orders of one partition) goes out as one record per items partition; an order that is
    bad, or whose chunk cannot be written (larger than a record may hold), is dead-lettered alone."""
    settings = Settings(partitions=2, split_chunk=10, bundle=50, max_message_bytes=2_524)  # a record of 1,500 bytes at most
    orders = [{"order_id": f"o-{number}", "items": [{"n": n} for n in range(3)]} for number in range(8)]
    huge = {"order_id": "huge", "items": [{"pad": "x" * 2_000}]}
    with TestDriver(settings=settings, item_step=lambda payload: payload) as driver:
        for order in [*orders[:4], {"order_id": "bad"}, huge, *orders[4:]]:
            driver.pipe("orders", order, partition=0, run=False)
        driver.run()
        items = driver.read("items")
        results = driver.read("item-results")
        dead = driver.dead_letters()
    messages = [message for record in results for message in record.value.get("messages", [record.value])]
    assert messages, "the items stage reported the outcomes"
    assert {message["kind"] for message in messages} <= {"items", "tick"}, "orders of one chunk send no open apart"
    assert len(items) == 2, "one record per items partition"
    sent = []
    for record in items:
        assert record.value["kind"] == "bundle"
        assert record.key == f"{record.value['messages'][0]['correlation_id']}#0"
        for chunk in record.value["messages"]:
            assert key_partition(f"{chunk['correlation_id']}#0".encode(), 2) == record.partition
            sent.append(chunk["correlation_id"])
            assert chunk["open"]["deadline_ms"] > 0
            assert [item["payload"]["n"] for item in chunk["items"]] == [0, 1, 2]
    assert sorted(sent) == sorted(order["order_id"] for order in orders)
    assert [(letter["reason"], letter["step"]) for letter in dead] == [("invalid", "validate"), ("invalid", "validate")]
