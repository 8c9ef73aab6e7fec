"""The keyed-state runtime without Kafka: outputs are checked before anything is stored, and one that cannot be
written is handled for its key alone (dead-lettered, cut to fit), never dropped without a trace."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app import shell
from weir.app.errors import dead_letter_record, fitted_dead_letter
from weir.app.runtime import environment, keyed
from weir.app.runtime.keyed import Change, KeyedState, Output, Refusal, TableStore, Undeliverable, prepare_outputs
from weir.app.testing import VirtualClock


class Topic:
    """Stands in for a Faust topic: what was sent to it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes | None, bytes]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.sent.append((key, value))


def _event() -> Any:
    return SimpleNamespace(message=SimpleNamespace(partition=0, topic="in", offset=7, key=b"k", headers=None, tp="in:0"))


@pytest.fixture
def dead_letters(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def record(letter: dict[str, Any]) -> None:
        sent.append(orjson.loads(fitted_dead_letter(letter, 10_000)))

    async def event_letter(event: Any, *, reason: str, error: str, agent: str, step: str, **_: Any) -> None:
        sent.append({"reason": reason, "error": error, "agent": agent, "step": step})

    monkeypatch.setattr(keyed, "send_dead_letter_record", record)
    monkeypatch.setattr(keyed, "send_dead_letter", event_letter)
    monkeypatch.setattr(keyed, "record_limit", lambda: 10_000)
    return sent


def test_prepare_outputs_sorts_what_fits_from_what_cannot_be_written() -> None:
    topic = Topic("out")
    small = Output(topic, "a", {"n": 1})  # type: ignore[arg-type]
    large = Output(topic, "b", {"blob": "x" * 2_000})  # type: ignore[arg-type]
    odd = Output(topic, "c", {"set": {1, 2}})  # type: ignore[arg-type]
    prepared = prepare_outputs([small, large, odd], 1_000)
    assert [output for output, _ in prepared.ready] == [small]
    [too_large, not_json] = prepared.undeliverable
    assert too_large.output is large
    assert too_large.size_bytes > 1_000
    assert len(too_large.sha256) == 64
    assert "more than a record may hold (1000)" in too_large.problem
    assert not_json.output is odd
    assert "not serialisable" in not_json.problem
    assert not_json.encoded is None


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=12), st.integers(min_value=50, max_value=2_000))
def test_every_output_is_either_ready_within_the_limit_or_undeliverable(values: list[str], limit: int) -> None:
    topic = Topic("out")
    outputs = [Output(topic, f"k{number}", {"v": value}) for number, value in enumerate(values)]  # type: ignore[arg-type]
    prepared = prepare_outputs(outputs, limit)
    assert len(prepared.ready) + len(prepared.undeliverable) == len(outputs)
    assert all(len(value) + len(output.key or "") <= limit for output, value in prepared.ready)
    assert [output for output, _ in prepared.ready] == [o for o in outputs if all(o is not f.output for f in prepared.undeliverable)]


def test_an_output_that_cannot_be_written_is_dead_lettered_and_the_hook_decides_the_state(dead_letters: list[dict[str, Any]]) -> None:
    table: dict[str, Any] = {}
    topic = Topic("results")
    seen: list[Undeliverable] = []

    def hook(key: str, previous: Any, change: Change[Any], failures: Any) -> Change[Any]:
        seen.extend(failures)
        return replace(change, state={"status": "dead-lettered"}, outputs=(Output(topic, key, {"status": "dead-lettered"}),))  # type: ignore[arg-type]

    shell: KeyedState[Any] = KeyedState(agent="t", store=TableStore(table, dict, dict), undeliverable=hook)  # type: ignore[arg-type]
    change: Change[Any] = Change(state={"status": "complete"}, outputs=(Output(topic, "g", {"blob": "q" * 50_000}),))  # type: ignore[arg-type]
    asyncio.run(shell.apply(_event(), "g", None, change))
    assert table == {"g": {"status": "dead-lettered"}}
    assert [orjson.loads(value) for _, value in topic.sent] == [{"status": "dead-lettered"}]
    [letter] = dead_letters
    assert (letter["reason"], letter["agent"], letter["key"]["text"]) == ("undeliverable", "t", "g")
    assert letter["value"]["truncated"]
    assert letter["value"]["size_bytes"] == seen[0].size_bytes
    assert shell.undeliverable_count == 1


def test_the_other_outputs_and_keys_go_on_and_a_replacement_that_still_fails_is_dropped_with_a_trace(
    dead_letters: list[dict[str, Any]],
) -> None:
    table: dict[str, Any] = {}
    topic = Topic("results")
    shell: KeyedState[Any] = KeyedState(agent="t", store=TableStore(table, dict, dict))  # type: ignore[arg-type]
    big = Output(topic, "a", "z" * 20_000)  # type: ignore[arg-type]
    fine = Output(topic, "a", "ok")  # type: ignore[arg-type]
    asyncio.run(shell.apply(_event(), "a", None, Change(state={"n": 1}, outputs=(big, fine), rejected=("no",))))
    asyncio.run(shell.apply(_event(), "b", None, Change(state={"n": 2}, outputs=(fine,))))
    assert table == {"a": {"n": 1}, "b": {"n": 2}}
    assert [value for _, value in topic.sent] == [b'"ok"', b'"ok"']
    assert sorted(letter["reason"] for letter in dead_letters) == ["rejected", "undeliverable"]


def test_a_refusal_is_dead_lettered_with_the_patterns_own_reason(dead_letters: list[dict[str, Any]]) -> None:
    table: dict[str, Any] = {}
    shell: KeyedState[Any] = KeyedState(agent="t", store=TableStore(table, dict, dict), step="claim")  # type: ignore[arg-type]
    change: Change[Any] = Change(state={"n": 1}, rejected=(Refusal("duplicate-order", "line 2 repeats line 1"), "plain"))
    asyncio.run(shell.apply(_event(), "a", None, change))
    assert [(letter["reason"], letter["error"], letter["step"]) for letter in dead_letters] == [
        ("duplicate-order", "line 2 repeats line 1", "claim"),
        ("rejected", "plain", "claim"),
    ]


def test_a_refusal_about_a_key_names_the_key_and_holds_the_dropped_state(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    async def event_letter(event: Any, **fields: Any) -> None:
        calls.append(fields)

    monkeypatch.setattr(keyed, "send_dead_letter", event_letter)
    monkeypatch.setattr(keyed, "record_limit", lambda: 10_000)
    table: dict[str, Any] = {"p": {"n": 1}}
    shell: KeyedState[Any] = KeyedState(agent="t", store=TableStore(table, dict, dict), step="expire")  # type: ignore[arg-type]
    dropped = Refusal("never-fired", "parent 'p' waited too long", key="p", value={"n": 1})
    asyncio.run(shell.apply(_event(), "p", {"n": 1}, Change(state=None, rejected=(dropped, "plain"))))
    assert table == {}
    assert [(call["reason"], call["key"], call["value"]) for call in calls] == [
        ("never-fired", b"p", orjson.dumps({"n": 1})),
        ("rejected", None, None),
    ]


def test_a_send_that_keeps_failing_raises_output_failed_after_the_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    from weir.app.errors import OutputFailed

    class Broken(Topic):
        async def send(self, *, key: bytes | None, value: bytes, headers: Any = None) -> None:
            self.sent.append((key, value))
            raise ConnectionError("broker gone")

    clock = VirtualClock(start_ms=0)
    topic = Broken("out")
    with environment.using(replace(environment.STANDALONE, clock=clock)), pytest.raises(OutputFailed, match="broker gone"):
        asyncio.run(keyed.send_prepared([(Output(topic, "k", "v"), b'"v"')]))  # type: ignore[arg-type]
    assert len(topic.sent) == keyed.SEND_ATTEMPTS
    assert clock.now_ms() == 600, "two waits on the environment's clock, 0.2 s then 0.4 s"


@settings(max_examples=120, deadline=None)
@given(
    value=st.one_of(st.binary(max_size=30_000), st.text(max_size=30_000), st.just('"' * 25_000)),
    key=st.one_of(st.none(), st.binary(max_size=3_000)),
    error=st.text(max_size=9_000),
    headers=st.lists(st.tuples(st.text(max_size=40), st.binary(max_size=600)), max_size=40),
    limit=st.integers(min_value=2_000, max_value=20_000),
)
def test_a_dead_letter_always_fits_and_keeps_where_and_why(value: Any, key: Any, error: str, headers: Any, limit: int) -> None:
    raw = value.encode() if isinstance(value, str) else value
    record = dead_letter_record(
        reason="undeliverable",
        error=error,
        agent="agg",
        step="emit",
        attempts=1,
        topic="t",
        partition=2,
        offset=9,
        key=key,
        value=raw,
        headers=headers,
    )
    encoded = fitted_dead_letter(record, limit)
    assert len(encoded) <= limit
    letter = orjson.loads(encoded)
    assert (letter["reason"], letter["agent"], letter["step"], letter["origin"]) == ("undeliverable", "agg", "emit", record["origin"])
    if letter["value"].get("truncated"):
        assert letter["value"]["size_bytes"] == len(raw)
    else:
        assert letter["value"] == record["value"]


def test_an_output_the_producer_refuses_fails_the_batch_instead_of_skipping_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """OutputFailed is not the input's fault: no dead letter, no owed outcome; it goes up and the batch fails."""
    from weir.app import core
    from weir.app.errors import OutputFailed

    letters: list[str] = []

    async def letter(*_: Any, **__: Any) -> None:
        letters.append("dead letter")

    async def owed(*_: Any) -> None:
        letters.append("owed outcome")

    async def run() -> None:
        raise OutputFailed("the result of 'o-1': KafkaTimeoutError")

    monkeypatch.setattr(shell, "send_dead_letter", letter)
    with pytest.raises(OutputFailed):
        asyncio.run(core.dead_lettered(_event(), agent="t", run=run, owed=owed))
    assert letters == []


def test_a_send_refused_because_the_transaction_is_gone_fails_at_once() -> None:
    from aiokafka.errors import IllegalOperation

    from weir.app.errors import OutputFailed

    class Fenced(Topic):
        async def send(self, *, key: bytes | None, value: bytes, headers: Any = None) -> None:
            self.sent.append((key, value))
            raise IllegalOperation("Can't send messages while not in transaction")

    topic = Fenced("out")
    with pytest.raises(OutputFailed, match="not in transaction"):
        asyncio.run(keyed.send_prepared([(Output(topic, "k", "v"), b'"v"')]))  # type: ignore[arg-type]
    assert len(topic.sent) == 1


class _Counted:
    """An encode and a decode that count their calls (a state is a frozenset of ids, stored as a sorted list)."""

    def __init__(self) -> None:
        self.encoded = 0
        self.decoded = 0

    def encode(self, state: frozenset[str]) -> list[str]:
        self.encoded += 1
        return sorted(state)

    def decode(self, raw: list[str]) -> frozenset[str]:
        self.decoded += 1
        return frozenset(raw)


def test_a_table_store_encodes_a_state_once_and_decodes_what_it_stored_not_again() -> None:
    table: dict[str, Any] = {}
    codec = _Counted()
    store: TableStore[frozenset[str]] = TableStore(table, codec.encode, codec.decode)  # type: ignore[arg-type]
    state = frozenset({"0.0", "1.0"})
    size = store.encoded_size("c", state)  # the size check and the save of one change share one encoding
    store.save("c", None, state)
    assert (codec.encoded, size) == (1, len(orjson.dumps(["0.0", "1.0"])) + 1)
    assert store.load("c") is state  # the value in the table is the one stored: no decode
    assert codec.decoded == 0
    table["c"] = ["0.0", "1.0", "2.0"]  # another value (the store read again after its scope wrote out): decoded
    assert store.load("c") == frozenset({"0.0", "1.0", "2.0"})
    assert codec.decoded == 1
    store.save("c", state, None)
    assert store.load("c") is None
    assert "c" not in table


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.one_of(st.none(), st.frozensets(st.sampled_from("xyz"), max_size=3))), max_size=30))
def test_a_table_store_remembering_states_loads_what_a_plain_decode_would(steps: list[tuple[str, frozenset[str] | None]]) -> None:
    table: dict[str, Any] = {}
    codec = _Counted()
    store: TableStore[frozenset[str]] = TableStore(table, codec.encode, codec.decode)  # type: ignore[arg-type]
    for key, state in steps:
        previous = store.load(key)
        if state is not None:
            store.encoded_size(key, state)
        store.save(key, previous, state)
        for any_key in "abc":
            raw = table.get(any_key)
            assert store.load(any_key) == (None if raw is None else frozenset(raw))


def test_a_table_store_forgets_what_it_remembered_when_the_scope_changes() -> None:
    """It holds no more than one scope's keys: a part's states are not kept alive past the part."""
    from weir.app import engine

    class Event:
        def __init__(self, partition: int) -> None:
            self.message = SimpleNamespace(partition=partition)

    table: dict[str, Any] = {}
    codec = _Counted()
    store: TableStore[frozenset[str]] = TableStore(table, codec.encode, codec.decode)  # type: ignore[arg-type]
    first, second = Event(0), Event(0)
    with engine.part_scope(first, []):  # type: ignore[arg-type]
        state = frozenset({"a"})
        store.save("k", None, state)
        assert store.load("k") is state
        assert codec.decoded == 0
    with engine.part_scope(second, []):  # type: ignore[arg-type]
        assert store.load("k") == state
        assert codec.decoded == 1, "a new scope: the state is decoded again, nothing of the last scope is held"
