"""Bundles: an items worker's outcome messages of one batch, one record per aggregator partition (app.aggregation)."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from app import aggregation, core
from app.aggregation import send_bundled, split_messages
from app.kafka_io import key_partition
from tests.unit.aggregate.test_aggregation_shell import _outcomes, _stage


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes, Any, int | None]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes, value: bytes, partition: int | None = None) -> None:
        self.sent.append((key, orjson.loads(value), partition))


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_a_key_goes_where_the_producers_default_partitioner_puts_it(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert key_partition(key, partitions) == DefaultPartitioner()(key, every, every)


@given(st.lists(st.integers(0, 400), min_size=0, max_size=60), st.integers(1, 8), st.integers(1, 12))
def test_each_bundle_holds_messages_of_one_partition_and_each_message_goes_once(numbers: list[int], partitions: int, size: int) -> None:
    topic = _Topic("results")
    core.topic_partitions["results"] = partitions
    outgoing = [(f"o-{number}", {"kind": "item", "correlation_id": f"o-{number}", "n": n}) for n, number in enumerate(numbers)]
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
    assert Counter(delivered) == Counter((key, message["n"]) for key, message in outgoing)


def test_no_bundles_when_the_partition_count_is_unknown_or_size_is_one() -> None:
    outgoing = [(f"o-{number}", {"kind": "item", "correlation_id": f"o-{number}"}) for number in range(20)]
    for name, size in (("unknown", 50), ("results", 1)):
        core.topic_partitions["results"] = 4
        topic = _Topic(name)
        asyncio.run(send_bundled(topic, outgoing, size=size))  # type: ignore[arg-type]
        assert [value["kind"] for _, value, _ in topic.sent] == ["item"] * 20
        assert all(partition is None for _, _, partition in topic.sent)


def test_the_aggregator_handles_each_message_of_a_bundle_and_dead_letters_a_bad_one_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    stage, emitted, _ = _stage()
    dead: list[Any] = []

    async def dead_letter(event: Any, *, reason: str, error: str, agent: str, step: str, **_: Any) -> None:
        dead.append((reason, step, core._handled_part.get()))

    monkeypatch.setattr(aggregation, "send_dead_letter", dead_letter)
    monkeypatch.setattr(core, "send_dead_letter", dead_letter)  # core.dead_lettered sends the bad message's
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

    monkeypatch.setattr(core.topics, "dead_letters", _DeadLetters())
    message = SimpleNamespace(topic="t", partition=0, offset=7, key=b"k", value=b'{"kind": "bundle"}', headers=[])
    event: Any = SimpleNamespace(message=message)
    with core.dead_letter_value({"part": 1}):
        asyncio.run(core.send_dead_letter(event, reason="invalid", error="e", agent="a", step="s"))
    asyncio.run(core.send_dead_letter(event, reason="invalid", error="e", agent="a", step="s"))
    assert [orjson.loads(record["value"]["text"]) for record in sent] == [{"part": 1}, {"kind": "bundle"}]
