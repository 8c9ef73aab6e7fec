"""The children's committed statuses in SQLite (app/trigger_status.py): written with the work, read a page at a time."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import orjson
import pytest

from weir import Application, Settings
from weir.app.outbox import SQLiteOutbox, write
from weir.app.trigger_status import SQLiteStatusSource, child_done, open_status_source, record_status


def test_a_status_commits_with_the_work_and_its_completion_or_not_at_all(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "app.sqlite")
    source = open_status_source(str(tmp_path / "app.sqlite"))
    try:
        with write(outbox, notify=lambda _: None) as tx:
            tx.connection.execute("CREATE TABLE work (id TEXT)")
        with write(outbox, notify=lambda _: None) as tx:
            tx.connection.execute("INSERT INTO work VALUES ('w-1')")
            row_id = child_done(tx, "p", "c1", topic_prefix="weir.")
        with contextlib.suppress(ZeroDivisionError), write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "c2", topic_prefix="weir.")
            _ = 1 / 0
        assert asyncio.run(source.statuses(["p", "unknown"])) == {"p": {"c1": "ok"}}
        [row] = outbox.fetch_batch(10).rows
        assert row.id == row_id
        assert (row.topic, row.key) == ("weir.triggers", b"p")
        assert orjson.loads(row.value or b"")["kind"] == "completion"
    finally:
        source.close()
        outbox.close()


def test_the_first_final_status_stays_and_many_parents_are_read_at_once(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "app.sqlite")
    source = SQLiteStatusSource(tmp_path / "app.sqlite")
    try:
        with write(outbox, notify=lambda _: None) as tx:
            for number in range(1_200):  # more parents than one statement binds
                child_done(tx, f"p{number}", "only", "ok" if number % 3 else "failed", topic_prefix="weir.")
            child_done(tx, "p1", "only", "failed", topic_prefix="weir.")  # redone: the first final status stays
        found = asyncio.run(source.statuses([f"p{number}" for number in range(1_200)]))
        assert len(found) == 1_200
        assert found["p1"] == {"only": "ok"}
        assert found["p3"] == {"only": "failed"}
        assert source.purge(recorded_before_ms=0) == 0
        assert source.purge(recorded_before_ms=2**62) == 1_200
        assert asyncio.run(source.statuses(["p1"])) == {}
    finally:
        source.close()
        outbox.close()


def test_a_child_done_names_its_parent_child_and_outcome(tmp_path: Path) -> None:
    outbox = SQLiteOutbox(tmp_path / "app.sqlite")
    try:
        with pytest.raises(ValueError, match="non-empty"), write(outbox, notify=lambda _: None) as tx:
            child_done(tx, "p", "", topic_prefix="weir.")
    finally:
        outbox.close()


def test_a_status_recorded_without_an_outbox_commits_with_the_work_alone(tmp_path: Path) -> None:
    """The seed's path: the status row in the child's own transaction, no outbox row (the child publishes itself)."""
    import sqlite3

    source = open_status_source(str(tmp_path / "own.sqlite"))
    connection = sqlite3.connect(tmp_path / "own.sqlite")
    try:
        with connection:
            connection.execute("CREATE TABLE work (id TEXT)")
            connection.execute("INSERT INTO work VALUES ('w-1')")
            record_status(connection, "p", "c1", "failed")
        with contextlib.suppress(ZeroDivisionError), connection:
            record_status(connection, "p", "c2")
            _ = 1 / 0
        assert asyncio.run(source.statuses(["p"])) == {"p": {"c1": "failed"}}
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"work", "weir_trigger_status"}, "no outbox table"
        with pytest.raises(ValueError, match="non-empty"):
            record_status(connection, "p", "", "ok")
    finally:
        connection.close()
        source.close()


def test_a_status_query_takes_the_parents_once() -> None:
    with pytest.raises(ValueError, match="parents"):
        SQLiteStatusSource("x.sqlite", query="SELECT job_id, task_id, state FROM tasks")
    with pytest.raises(ValueError, match="parents"):
        open_status_source("postgresql://nowhere/db", query="SELECT 1 WHERE a IN ({parents}) OR b IN ({parents})")


def test_the_sweep_reads_the_outbox_database_unless_told_otherwise(tmp_path: Path) -> None:
    """On by default: the status store is the outbox's database, where child_done writes; ``none`` turns it off."""
    outbox = str(tmp_path / "state" / "outbox.sqlite")
    assert Settings(outbox_db=outbox).trigger_status_location == outbox
    assert Settings(outbox_db=outbox, trigger_status_db="postgresql://h/db").trigger_status_location == "postgresql://h/db"
    assert Settings(outbox_db=outbox, trigger_status_db="none").trigger_status_location is None
    source = Application(Settings(outbox_db=outbox)).trigger_status()
    assert isinstance(source, SQLiteStatusSource)
    try:
        assert source.name == outbox
        assert asyncio.run(source.statuses(["p"])) == {}, "the embedded store is made on first use, its folder too"
        assert (tmp_path / "state" / "outbox.sqlite").exists()
    finally:
        source.close()
    assert Application(Settings(trigger_status_db="none")).trigger_status() is None
    query = "SELECT a, b, c FROM t WHERE a IN ({parents})"
    queried = Application(Settings(outbox_db=outbox, trigger_status_query=query)).trigger_status()
    assert isinstance(queried, SQLiteStatusSource)
    assert queried.query == query
    queried.close()


def test_a_status_query_without_its_parents_is_refused_with_the_settings() -> None:
    from weir import SettingError

    with pytest.raises(SettingError, match="WEIR_TRIGGER_STATUS_QUERY"):
        Settings(trigger_status_query="SELECT a, b, c FROM t")
