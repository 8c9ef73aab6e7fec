"""The trigger stage (app/trigger_topology.py) on the test driver: expiry through the keyed-state runtime, the sweep.

Sweep ticks walk the parents' deadline index; what expires unfired leaves every table and goes to one dead letter
keyed by the parent. The clock is virtual; nothing sleeps or touches Kafka.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from tests.integration.test_triggers import make_parents, registration
from weir import Settings, TestDriver
from weir.app.outbox import SQLiteOutbox, write
from weir.app.trigger_status import SQLiteStatusSource, child_done
from weir.tables.triggers import DEFAULT_WAKE_TOPIC, completion_message, outcome_summary, registration_message

SETTINGS = Settings(partitions=1, sweep_grace_ms=1_000, sweep_interval_ms=250, done_retention_ms=5_000, trigger_orphan_retention_ms=8_000)
CONFIG = SimpleNamespace(
    sweep_grace_ms=SETTINGS.sweep_grace_ms,
    done_retention_ms=SETTINGS.done_retention_ms,
    orphan_retention_ms=SETTINGS.trigger_orphan_retention_ms,
)


class Shell:
    """The trigger stage on the test driver: its tables, wakes and dead letters as the driver keeps them, its clock virtual."""

    def __init__(self, source: Any = None) -> None:
        self.driver = TestDriver(settings=SETTINGS, triggers=True, status_source=source)
        assert self.driver.triggers is not None
        self.topology = self.driver.triggers

    @property
    def now(self) -> int:
        return self.driver.clock.now_ms()

    @property
    def wakes(self) -> list[tuple[str | None, Any]]:
        return [(record.key, record.value) for record in self.driver.read(DEFAULT_WAKE_TOPIC)]

    @property
    def dead_letters(self) -> list[dict[str, Any]]:
        return self.driver.dead_letters()

    def send(self, *messages: tuple[str, dict[str, Any]]) -> None:
        for key, value in messages:
            self.driver.pipe("triggers", value, key=key, run=False)
        self.driver.run()

    def tick(self, at_ms: int) -> None:
        """Move the clock to ``at_ms``: the sweep ticks every WEIR_SWEEP_INTERVAL_MS on the way."""
        self.driver.advance(ms=at_ms - self.now)

    def keys_of(self, parent_id: str) -> dict[str, Any]:
        """What the parent's own tables (states, fired markers) hold for it."""
        tables = {"states": self.driver.table("triggers"), "fired": self.driver.table("triggers_fired")}
        return {name: table[parent_id] for name, table in tables.items() if parent_id in table}


@pytest.fixture
def shell() -> Iterator[Shell]:
    shell = Shell()
    yield shell
    shell.driver.close()


def test_a_parent_that_never_registers_leaves_nothing_and_one_dead_letter(shell: Shell) -> None:
    shell.send(completion_message("orphan", "a"), completion_message("orphan", "b"), completion_message("orphan", "a"))
    assert set(shell.keys_of("orphan")) == {"states"}
    shell.tick(shell.now + CONFIG.orphan_retention_ms - 1_000)
    assert shell.keys_of("orphan"), "kept for its whole retention"
    shell.tick(shell.now + 1_000)
    assert shell.keys_of("orphan") == {}
    [letter] = shell.dead_letters
    assert letter["reason"] == "orphan-completions"
    assert letter["key"]["text"] == "orphan"
    held = orjson.loads(letter["value"]["text"])
    assert held["state"]["children"] == {"a": "ok", "b": "ok"}
    shell.tick(shell.now + 10 * CONFIG.orphan_retention_ms)
    assert len(shell.dead_letters) == 1
    assert not shell.wakes


def test_a_fired_mark_expires_and_what_comes_after_it_expires_as_never_fired(shell: Shell) -> None:
    shell.send(registration_message("p", 1), completion_message("p", "a"))
    assert len(shell.wakes) == 1
    assert set(shell.keys_of("p")) == {"fired"}, "a fired trigger keeps only its marker"
    fired_at = shell.now
    shell.tick(fired_at + CONFIG.done_retention_ms)
    assert shell.keys_of("p") == {}
    shell.send(completion_message("p", "a"), registration_message("p", 2))  # late, and a repeat of the registration
    assert set(shell.keys_of("p")) == {"states"}
    shell.tick(shell.now + CONFIG.orphan_retention_ms)
    assert shell.keys_of("p") == {}
    assert [letter["reason"] for letter in shell.dead_letters] == ["never-fired"]
    assert len(shell.wakes) == 1
    # the sweep queue drained too: no entry waits for a parent that is gone
    shell.tick(shell.now + 60_000)
    assert shell.topology.sweep_queue.waiting(0) == 0


def test_the_sweep_wakes_a_parent_from_the_childrens_committed_statuses_once(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "children.sqlite")
    source = SQLiteStatusSource(tmp_path / "children.sqlite")
    shell = Shell(source)
    try:
        shell.send(registration_message("p", 2), registration_message("q", 1))
        shell.send(completion_message("p", "a"))  # p's first child was heard; its second committed and died
        with write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "a", topic_prefix="weir.")
            child_done(tx, "p", "b", "failed", topic_prefix="weir.")
        with contextlib.suppress(RuntimeError), write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "q", "x", topic_prefix="weir.")
            raise RuntimeError("the child's transaction rolled back: no status, no completion")
        shell.tick(shell.now + CONFIG.sweep_grace_ms - 250)
        assert not shell.wakes, "within the grace period the sweep does not look"
        shell.tick(shell.now + 250)
        [(key, wake)] = shell.wakes
        assert (key, wake["fired_by"], wake["summary"]["failed"]) == ("p", "sweep", ["b"])
        # the relay publishes the completions later: they change nothing
        shell.send(completion_message("p", "b", "failed"), completion_message("p", "a"))
        shell.tick(shell.now + 3 * CONFIG.sweep_grace_ms)
        assert len(shell.wakes) == 1
        assert set(shell.keys_of("q")) == {"states"}, "q's child never committed: q waits"
        assert outbox.pending_count() == 2, "the completions are outbox rows, published by the relay"
    finally:
        shell.driver.close()
        source.close()
        outbox.close()


def test_the_sweep_reads_the_users_own_tables_through_a_query(tmp_path: Path) -> None:
    """The seed's "check the condition with a join": no weir status table, the user's own rows say which children ended."""
    import sqlite3

    database = tmp_path / "jobs.sqlite"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE tasks (job_id TEXT, task_id TEXT, state TEXT)")
        connection.executemany("INSERT INTO tasks VALUES (?, ?, ?)", [("p", "a", "ok"), ("p", "b", "running"), ("p", "c", "ok")])
        connection.execute("INSERT INTO tasks VALUES ('other', 'z', 'ok')")
    query = "SELECT job_id, task_id, state FROM tasks WHERE state IN ('ok', 'failed') AND job_id IN ({parents})"
    source = SQLiteStatusSource(database, query=query)
    shell = Shell(source)
    try:
        shell.send(registration_message("p", 3), registration_message("other", 2))  # no completion is ever published
        shell.tick(shell.now + CONFIG.sweep_grace_ms + 500)
        assert not shell.wakes, "b is still running: p waits"
        with sqlite3.connect(database) as connection:
            connection.execute("UPDATE tasks SET state = 'failed' WHERE task_id = 'b'")
        shell.tick(shell.now + CONFIG.sweep_grace_ms + 500)
        [(key, wake)] = shell.wakes
        assert (key, wake["fired_by"], wake["summary"]["failed"]) == ("p", "sweep", ["b"])
        assert set(shell.keys_of("other")) == {"states"}, "one of other's two children: it waits"
        assert source.purge(recorded_before_ms=2**62) == 0, "weir never deletes the user's rows"
        with sqlite3.connect(database) as connection:
            assert connection.execute("SELECT count(*) FROM tasks").fetchone() == (4,)
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"tasks"}, "weir created no table of its own there"
    finally:
        shell.driver.close()
        source.close()


def test_a_status_message_is_no_longer_a_source_of_truth_but_a_dead_letter(shell: Shell) -> None:
    shell.send(registration_message("p", 1), ("p", {"kind": "status", "parent_id": "p", "child_id": "a", "outcome": "ok"}))
    shell.tick(shell.now + 2 * CONFIG.sweep_grace_ms)
    assert not shell.wakes
    assert [letter["reason"] for letter in shell.dead_letters] == ["invalid"]


def test_a_status_source_that_fails_fires_nothing_and_the_sweep_looks_again(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "children.sqlite")
    source = SQLiteStatusSource(tmp_path / "children.sqlite")
    answers: list[str] = []

    class AwayOnce:
        """The source, away at its first query."""

        async def statuses(self, parent_ids: Any) -> dict[str, dict[str, str]]:
            if not answers:
                answers.append("away")
                raise OSError("database unreachable")
            answers.append("answered")
            return await source.statuses(parent_ids)

        async def purge_older(self, recorded_before_ms: int) -> int:
            return await source.purge_older(recorded_before_ms)

        def close(self) -> None:
            source.close()

    shell = Shell(AwayOnce())
    try:
        shell.send(registration_message("p", 1))
        with write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "a", topic_prefix="weir.")
        shell.tick(shell.now + CONFIG.sweep_grace_ms)
        assert answers == ["away"]
        assert not shell.wakes
        assert not shell.dead_letters, "a source that cannot answer is not a dead letter"
        shell.tick(shell.now + shell.topology.recheck_ms)
        assert answers == ["away", "answered"]
        assert [wake["fired_by"] for _, wake in shell.wakes] == ["sweep"]
    finally:
        shell.driver.close()
        source.close()
        outbox.close()


def test_every_parent_is_woken_once_whatever_the_order_duplicates_and_early_completions() -> None:
    """200 parents, their children's completions shuffled, a fifth of them redelivered, a third before the parent
    registered: each parent woken once with its children's summary, and the trigger state written once per parent per
    batch, not once per event. (The broker test of the same ran two workers; a SIGKILL of one stays there.)"""

    rng = random.Random(11)
    parents = make_parents(200, seed=5)
    completions = [
        completion_message(parent, child, outcome) for parent, children in parents.items() for child, outcome in children.items()
    ]
    completions += rng.sample(completions, len(completions) // 5)  # redelivered
    rng.shuffle(completions)
    early, late = completions[: len(completions) // 3], completions[len(completions) // 3 :]
    registrations = [registration(parent, children) for parent, children in parents.items()]
    rng.shuffle(registrations)
    shell = Shell()
    try:
        for batch in (early, registrations, late):  # children that end before their parent registered, then the rest
            shell.send(*batch)
        wakes = [wake for _, wake in shell.wakes]
        counts = Counter(wake["parent_id"] for wake in wakes)
        assert counts == dict.fromkeys(parents, 1), "every parent woken, once"
        assert not shell.dead_letters, "valid trigger messages are not dead-lettered"
        for wake in wakes:
            children = parents[wake["parent_id"]]
            assert wake["expected_count"] == len(children)
            assert wake["summary"] == outcome_summary(children), wake
            assert wake["context"] == {"resume_at": f"step-after-{wake['parent_id']}"}
        fired_by = Counter(wake["fired_by"] for wake in wakes)
        assert fired_by["sweep"] == 0, "no completion was lost and no status source is set: the sweep has nothing to fire"
        assert fired_by["registration"] > 0, "some parents registered after all their children ended"
        stats = shell.topology.stats
        events = len(completions) + len(registrations)
        assert stats.events == events
        assert stats.counted[0].writes < events, "trigger state is written once per parent per batch, not once per event"
    finally:
        shell.driver.close()
