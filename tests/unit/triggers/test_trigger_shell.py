"""The trigger agent's shell (agents/triggers.py) over plain dicts as its tables: expiry through the keyed-state runtime.

Sweep ticks walk the parents' deadline index; what expires unfired leaves every table and goes to one dead letter
keyed by the parent. The clock is an argument; nothing sleeps or touches Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from agents import triggers
from app.outbox import SQLiteOutbox, write
from app.runtime import keyed
from app.trigger_status import SQLiteStatusSource, child_done
from tables.triggers import DEFAULT_WAKE_TOPIC, completion_message, registration_message

CONFIG = replace(triggers.CONFIG, sweep_grace_ms=1_000, done_retention_ms=5_000, orphan_retention_ms=8_000)


class Topic:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes | None, Any]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.sent.append((key, orjson.loads(value)))


class Shell:
    """The agent's module with its tables, wake topic, dead letters, clock and tick sender replaced by plain objects."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tables = [view.table for view in triggers._counted]
        self.dicts: list[dict[str, Any]] = [{} for _ in triggers._counted]
        for view, table in zip(triggers._counted, self.dicts, strict=True):
            view.table = table  # type: ignore[assignment]
        self.wakes = Topic(DEFAULT_WAKE_TOPIC)
        self.dead_letters: list[dict[str, Any]] = []
        self.now = 1_000_000
        self.offset = 0

        async def dead_letter(event: Any, *, reason: str, error: str, agent: str, step: str, key: bytes | None = None, **_: Any) -> None:
            self.dead_letters.append({"reason": reason, "error": error, "key": key, **_})

        async def no_tick(*_: Any) -> None:
            return None

        monkeypatch.setattr(triggers, "CONFIG", CONFIG)
        monkeypatch.setitem(triggers._wake_topics, DEFAULT_WAKE_TOPIC, self.wakes)
        monkeypatch.setattr(keyed, "send_dead_letter", dead_letter)
        monkeypatch.setattr(triggers, "send_dead_letter", dead_letter)
        monkeypatch.setattr(keyed, "record_limit", lambda: 100_000)
        monkeypatch.setattr(keyed, "wall_clock_ms", lambda: self.now)
        monkeypatch.setattr(triggers.signals, "send", no_tick)

    def restore(self) -> None:
        for view, table in zip(triggers._counted, self.tables, strict=True):
            view.table = table

    def _event(self, key: str | None, value: dict[str, Any]) -> Any:
        self.offset += 1
        message = SimpleNamespace(
            partition=0, topic="triggers", offset=self.offset, key=key.encode() if key else None, value=orjson.dumps(value), headers=None
        )
        return SimpleNamespace(message=message)

    def send(self, *messages: tuple[str, dict[str, Any]]) -> None:
        events = [self._event(key, value) for key, value in messages]
        asyncio.run(triggers._handle_partition(events, self.now))

    def tick(self, at_ms: int) -> None:
        self.now = at_ms
        asyncio.run(triggers._handle_partition([self._event(None, {"kind": "sweep"})], self.now))

    def keys_of(self, parent_id: str) -> dict[str, Any]:
        """What the parent's own tables (states, fired markers) hold for it."""
        return {name: table[parent_id] for name, table in zip(("states", "fired"), self.dicts[:2], strict=True) if parent_id in table}


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:
    shell = Shell(monkeypatch)
    yield shell
    shell.restore()


def test_a_parent_that_never_registers_leaves_nothing_and_one_dead_letter(shell: Shell) -> None:
    shell.send(completion_message("orphan", "a"), completion_message("orphan", "b"), completion_message("orphan", "a"))
    assert set(shell.keys_of("orphan")) == {"states"}
    shell.tick(shell.now + CONFIG.orphan_retention_ms - 1_000)
    assert shell.keys_of("orphan"), "kept for its whole retention"
    shell.tick(shell.now + 1_000)
    assert shell.keys_of("orphan") == {}
    [letter] = shell.dead_letters
    assert letter["reason"] == "orphan-completions"
    assert letter["key"] == b"orphan"
    held = orjson.loads(letter["value"])
    assert held["state"]["children"] == {"a": "ok", "b": "ok"}
    shell.tick(shell.now + 10 * CONFIG.orphan_retention_ms)
    assert len(shell.dead_letters) == 1
    assert not shell.wakes.sent


def test_a_fired_mark_expires_and_what_comes_after_it_expires_as_never_fired(shell: Shell) -> None:
    shell.send(registration_message("p", 1), completion_message("p", "a"))
    assert len(shell.wakes.sent) == 1
    assert set(shell.keys_of("p")) == {"fired"}, "a fired trigger keeps only its marker"
    fired_at = shell.now
    shell.tick(fired_at + CONFIG.done_retention_ms)
    assert shell.keys_of("p") == {}
    shell.send(completion_message("p", "a"), registration_message("p", 2))  # late, and a repeat of the registration
    assert set(shell.keys_of("p")) == {"states"}
    shell.tick(shell.now + CONFIG.orphan_retention_ms)
    assert shell.keys_of("p") == {}
    assert [letter["reason"] for letter in shell.dead_letters] == ["never-fired"]
    assert len(shell.wakes.sent) == 1
    # the sweep queue drained too: no entry waits for a parent that is gone
    shell.tick(shell.now + 60_000)
    assert triggers.sweep_queue.waiting(0) == 0


def test_the_sweep_wakes_a_parent_from_the_childrens_committed_statuses_once(
    shell: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = SQLiteOutbox(tmp_path / "children.sqlite")
    source = SQLiteStatusSource(tmp_path / "children.sqlite")
    monkeypatch.setattr(triggers, "_status_source", source)
    try:
        shell.send(registration_message("p", 2), registration_message("q", 1))
        shell.send(completion_message("p", "a"))  # p's first child was heard; its second committed and died
        with write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "a", topic_prefix="weir.")
            child_done(tx, "p", "b", "failed", topic_prefix="weir.")
        with contextlib.suppress(RuntimeError), write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "q", "x", topic_prefix="weir.")
            raise RuntimeError("the child's transaction rolled back: no status, no completion")
        shell.tick(shell.now + CONFIG.sweep_grace_ms - 1)
        assert not shell.wakes.sent, "within the grace period the sweep does not look"
        shell.tick(shell.now + 1)
        [(key, wake)] = shell.wakes.sent
        assert (key, wake["fired_by"], wake["summary"]["failed"]) == (b"p", "sweep", ["b"])
        # the relay publishes the completions later: they change nothing
        shell.send(completion_message("p", "b", "failed"), completion_message("p", "a"))
        shell.tick(shell.now + 3 * CONFIG.sweep_grace_ms)
        assert len(shell.wakes.sent) == 1
        assert set(shell.keys_of("q")) == {"states"}, "q's child never committed: q waits"
        assert outbox.pending_count() == 2, "the completions are outbox rows, published by the relay"
    finally:
        source.close()
        outbox.close()


def test_a_status_message_is_no_longer_a_source_of_truth_but_a_dead_letter(shell: Shell) -> None:
    shell.send(registration_message("p", 1), ("p", {"kind": "status", "parent_id": "p", "child_id": "a", "outcome": "ok"}))
    shell.tick(shell.now + 2 * CONFIG.sweep_grace_ms)
    assert not shell.wakes.sent
    assert [letter["reason"] for letter in shell.dead_letters] == ["invalid"]


def test_a_status_source_that_fails_fires_nothing_and_the_sweep_looks_again(
    shell: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = SQLiteOutbox(tmp_path / "children.sqlite")
    source = SQLiteStatusSource(tmp_path / "children.sqlite")
    answers: list[str] = []

    async def away(parent_ids: Any) -> dict[str, dict[str, str]]:
        answers.append("away")
        raise OSError("database unreachable")

    monkeypatch.setattr(triggers, "_status_source", source)
    monkeypatch.setattr(triggers, "RECHECK_MS", 2_000)
    try:
        shell.send(registration_message("p", 1))
        with write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "a", topic_prefix="weir.")
        with monkeypatch.context() as patched:
            patched.setattr(source, "statuses", away)
            shell.tick(shell.now + CONFIG.sweep_grace_ms)
        assert answers == ["away"]
        assert not shell.wakes.sent
        assert not shell.dead_letters, "a source that cannot answer is not a dead letter"
        shell.tick(shell.now + triggers.RECHECK_MS)
        assert [wake["fired_by"] for _, wake in shell.wakes.sent] == ["sweep"]
    finally:
        source.close()
        outbox.close()
