"""The counter trigger's source of truth: children's final statuses committed with their work, read by the safety sweep.

A child that does its work in a database records its final status in the same transaction, and its completion event
reaches the triggers topic one of two ways:

- through the outbox (:func:`child_done`): the status row and the completion as an outbox row, which the relay
  publishes later;
- straight to the broker after the commit, the seed's way that spares the database an outbox row
  (:func:`record_status` in the transaction, then :class:`CompletionPublisher` once it committed).

A child that commits and dies before its completion is published leaves its status row behind; the sweep
(agents/triggers.py) asks a :class:`StatusSource` reading that table for the children of every trigger still waiting
after its grace period, and the answer goes through the trigger's core like any completion. The source is on by
default: the outbox's database (``WEIR_OUTBOX_DB``, an embedded SQLite file under ``.weir`` unless named), where both
paths write. ``open_status_source(location, query=...)`` makes the sweep's check a query over the user's own tables
instead (the seed's join).

SQLite and PostgreSQL, the outbox's two databases. Queries run in a thread of the source's own (never on the
event loop), one query per page of parents the sweep reads.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
from aiokafka import AIOKafkaProducer

from weir.app.codec import dumps
from weir.app.kafka_io import client_options_or_env
from weir.app.outbox import OutboxTransaction
from weir.tables.triggers import OK, TRIGGERS_TOPIC, completion_message

__all__ = [
    "STATUS_TABLE",
    "CompletionPublisher",
    "PostgresStatusSource",
    "SQLiteStatusSource",
    "StatusSource",
    "child_done",
    "open_status_source",
    "record_status",
]

#: The table of children's final statuses, in the database the children write (next to their outbox).
STATUS_TABLE = "weir_trigger_status"

_SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {STATUS_TABLE} (
    parent_id TEXT NOT NULL,
    child_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    recorded_ms INTEGER NOT NULL,
    PRIMARY KEY (parent_id, child_id)
)
"""
_PG_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {STATUS_TABLE} (
    parent_id TEXT NOT NULL,
    child_id TEXT NOT NULL,
    outcome TEXT NOT NULL,
    recorded_ms BIGINT NOT NULL,
    PRIMARY KEY (parent_id, child_id)
)
"""
#: Advisory lock key of the status table's creation: ``'weir'`` in ASCII, then ``'trst'`` (the outbox's keys use the table oid).
_PG_SCHEMA_LOCK = (0x77656972 << 32) | 0x74727374
#: Parents per SQL statement (SQLite's default limit on bound variables is 32,766; older builds' 999).
_QUERY_CHUNK = 500

_T = TypeVar("_T")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _ensure_sqlite_table(connection: sqlite3.Connection) -> None:
    connection.execute(_SQLITE_SCHEMA)


def _ensure_pg_table(connection: Any) -> None:
    """Create the table once, never running DDL when it exists (DDL takes locks a writer's transaction may wait for)."""
    if connection.execute("SELECT to_regclass(%s)", (STATUS_TABLE,)).fetchone()[0] is not None:
        return
    connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_SCHEMA_LOCK,))
    connection.execute(_PG_SCHEMA)


def record_status(connection: Any, parent_id: str, child_id: str, outcome: str = OK) -> None:
    """In the child's own database transaction: its final status row, what the safety sweep reads.

    ``connection``: the ``sqlite3`` or ``psycopg`` connection of the transaction that commits the child's work (the
    first final status of a child stays). Alone, this is the seed's path: publish the completion straight to the
    broker once the transaction committed (:class:`CompletionPublisher`); a child that dies in between is found by
    the sweep. :func:`child_done` does both in one outbox transaction instead. The first call creates the table if it
    is missing; in PostgreSQL, with many writers starting at once, create it beforehand
    (``open_status_source(url).ensure_table()``) rather than inside their transactions.
    """
    if not parent_id or not child_id or not outcome:
        message = f"a child's status needs a non-empty parent_id, child_id and outcome, got {parent_id!r}, {child_id!r}, {outcome!r}"
        raise ValueError(message)
    if isinstance(connection, sqlite3.Connection):
        _ensure_sqlite_table(connection)
        insert = f"INSERT INTO {STATUS_TABLE} VALUES (?, ?, ?, ?) ON CONFLICT (parent_id, child_id) DO NOTHING"
    else:
        _ensure_pg_table(connection)
        insert = f"INSERT INTO {STATUS_TABLE} VALUES (%s, %s, %s, %s) ON CONFLICT (parent_id, child_id) DO NOTHING"
    connection.execute(insert, (parent_id, child_id, outcome, _now_ms()))


def child_done(tx: OutboxTransaction, parent_id: str, child_id: str, outcome: str = OK, *, topic_prefix: str) -> int:
    """In the child's outbox transaction: its final status row (:func:`record_status`) and its completion event,
    committed with its work; the completion goes to ``<topic_prefix>triggers`` when the relay publishes the outbox
    row (returned: its id). Either way the parent is woken once."""
    record_status(tx.connection, parent_id, child_id, outcome)
    key, completion = completion_message(parent_id, child_id, outcome)
    return tx.add_json(completion, key=key, topic=f"{topic_prefix}{TRIGGERS_TOPIC}")


class CompletionPublisher:
    """The seed's "publish straight after commit": a child's completion sent to the triggers topic by the child.

    Use it after the transaction that committed the child's work and its :func:`record_status` row::

        async with CompletionPublisher(bootstrap, topic_prefix="weir.") as completions:
            with connection:                      # the child's own transaction
                ...                               # its work
                record_status(connection, parent_id, child_id, "ok")
            await completions.done(parent_id, child_id, "ok")

    ``done`` returns once the broker has the event (idempotent producer, every replica). It raises when the broker
    cannot be reached; the status row is committed by then, so the sweep wakes the parent after its grace period
    even if the child gives up or dies. A completion sent twice is counted once (children are counted by id).
    """

    def __init__(self, bootstrap: str, *, topic_prefix: str, client_options: Mapping[str, Any] | None = None) -> None:
        self.topic = f"{topic_prefix}{TRIGGERS_TOPIC}"
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", **client_options_or_env(client_options)
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except BaseException:  # refused or unreachable: close what start opened
            await self._producer.stop()
            raise

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> CompletionPublisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def done(self, parent_id: str, child_id: str, outcome: str = OK) -> None:
        key, completion = completion_message(parent_id, child_id, outcome)
        await self._producer.send_and_wait(self.topic, value=dumps(completion), key=key.encode())


class StatusSource(Protocol):
    """Where the sweep reads children's committed final statuses."""

    async def statuses(self, parent_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """Parent id -> child id -> outcome, for those of ``parent_ids`` with any status recorded."""
        ...

    async def purge_older(self, recorded_before_ms: int) -> int:
        """Delete the statuses recorded before ``recorded_before_ms``; how many."""
        ...

    def close(self) -> None: ...


#: Where a user's query (``query=``) takes the list of parent ids.
PARENTS = "{parents}"


class _ThreadedSource(abc.ABC):
    """A source whose blocking queries run in one thread of its own (its connection lives there, opened at the
    first query, which creates the table if need be): making one never blocks, nor touches the database.

    ``query``: the sweep's check as a query over the user's own tables instead of ``weir_trigger_status``: SQL that
    selects ``(parent id, child id, outcome)`` for every child that *ended*, of the parents whose ids it takes as a
    list where it says ``{parents}`` (``... WHERE job_id IN ({parents})``). weir neither creates nor purges the
    user's tables.
    """

    name: str
    _mark: str

    def __init__(self, query: str | None = None) -> None:
        if query is not None and query.count(PARENTS) != 1:
            raise ValueError(f"a status query takes the parent ids where it says {PARENTS} (once), got {query!r}")
        self.query = query
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weir-trigger-status")
        self._local = threading.local()

    def _statement(self, count: int) -> str:
        marks = ", ".join(self._mark for _ in range(count))
        if self.query is not None:
            return self.query.replace(PARENTS, marks)
        return f"SELECT parent_id, child_id, outcome FROM {STATUS_TABLE} WHERE parent_id IN ({marks})"

    async def statuses(self, parent_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        wanted = sorted(set(parent_ids))
        if not wanted:
            return {}
        return await self._in_thread(self._query_all, wanted)

    async def _in_thread(self, call: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(call, *args))

    def _query_all(self, parent_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        found: dict[str, dict[str, str]] = {}
        for start in range(0, len(parent_ids), _QUERY_CHUNK):
            for parent_id, child_id, outcome in self._query(parent_ids[start : start + _QUERY_CHUNK]):
                found.setdefault(str(parent_id), {})[str(child_id)] = str(outcome)
        return found

    @abc.abstractmethod
    def _query(self, parent_ids: Sequence[str]) -> list[tuple[Any, Any, Any]]:
        """(parent id, child id, outcome) rows of these parents, in the source's thread."""

    def ensure_table(self) -> None:
        """Connect and create the table if it is missing (blocking: not from an event loop)."""
        self._executor.submit(self._connection).result()

    @abc.abstractmethod
    def _connection(self) -> Any: ...

    def purge(self, *, recorded_before_ms: int) -> int:
        """Delete statuses recorded before ``recorded_before_ms`` (keep them longer than any trigger waits); returns how many."""
        return self._executor.submit(self._purge, recorded_before_ms).result()

    async def purge_older(self, recorded_before_ms: int) -> int:
        """:meth:`purge` from an event loop: in the source's thread, the loop never blocked."""
        return await self._in_thread(self._purge, recorded_before_ms)

    @abc.abstractmethod
    def _purge(self, recorded_before_ms: int) -> int: ...

    def close(self) -> None:
        self._executor.submit(self._close).result()
        self._executor.shutdown(wait=True)

    @abc.abstractmethod
    def _close(self) -> None: ...


class SQLiteStatusSource(_ThreadedSource):
    """Statuses in the SQLite database the children write (usually the outbox's file, ``WEIR_OUTBOX_DB``)."""

    _mark = "?"

    def __init__(self, path: str | Path, *, query: str | None = None, busy_timeout_ms: int = 30_000) -> None:
        super().__init__(query)
        self.path = Path(path)
        self.name = str(self.path)
        self._busy_timeout_ms = busy_timeout_ms

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            if self.query is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)  # the default file, under .weir: made on first use
            connection = sqlite3.connect(self.path, isolation_level=None)
            connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            if self.query is None:
                _ensure_sqlite_table(connection)
            self._local.connection = connection
        return connection

    def _query(self, parent_ids: Sequence[str]) -> list[tuple[Any, Any, Any]]:
        return list(self._connection().execute(self._statement(len(parent_ids)), tuple(parent_ids)).fetchall())

    def _purge(self, recorded_before_ms: int) -> int:
        if self.query is not None:
            return 0  # the user's own tables
        cursor = self._connection().execute(f"DELETE FROM {STATUS_TABLE} WHERE recorded_ms < ?", (recorded_before_ms,))
        return int(cursor.rowcount)

    def _close(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class PostgresStatusSource(_ThreadedSource):
    """Statuses in PostgreSQL (the table in the URL's search_path, as the outbox's tables)."""

    _mark = "%s"

    def __init__(self, url: str, *, query: str | None = None, connect_timeout_s: int = 10) -> None:
        super().__init__(query)
        self.url = url
        self.name = "postgresql"
        self._connect_timeout_s = connect_timeout_s

    def _connection(self) -> Any:
        connection = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            connection = psycopg.connect(self.url, autocommit=True, connect_timeout=self._connect_timeout_s)
            if self.query is None:
                with connection.transaction():
                    _ensure_pg_table(connection)
            self._local.connection = connection
        return connection

    def _query(self, parent_ids: Sequence[str]) -> list[tuple[Any, Any, Any]]:
        try:
            if self.query is None:
                statement = f"SELECT parent_id, child_id, outcome FROM {STATUS_TABLE} WHERE parent_id = ANY(%s)"
                return list(self._connection().execute(statement, (list(parent_ids),)).fetchall())
            return list(self._connection().execute(self._statement(len(parent_ids)), tuple(parent_ids)).fetchall())
        except psycopg.OperationalError:
            self._drop_connection()  # the next query connects again
            raise

    def _purge(self, recorded_before_ms: int) -> int:
        if self.query is not None:
            return 0  # the user's own tables
        cursor = self._connection().execute(f"DELETE FROM {STATUS_TABLE} WHERE recorded_ms < %s", (recorded_before_ms,))
        return int(cursor.rowcount)

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def _close(self) -> None:
        self._drop_connection()


def open_status_source(location: str, *, query: str | None = None) -> SQLiteStatusSource | PostgresStatusSource:
    """The status source at ``location`` (``WEIR_TRIGGER_STATUS_DB``, by default ``WEIR_OUTBOX_DB``): a
    ``postgresql://`` URL or a SQLite file path; reading ``weir_trigger_status``, or the user's own tables through
    ``query`` (``WEIR_TRIGGER_STATUS_QUERY``): SQL that selects ``(parent id, child id, outcome)`` for every child
    that ended, of the parents whose ids it takes where it says ``{parents}``, e.g.
    ``SELECT job_id, task_id, status FROM tasks WHERE status IN ('ok', 'failed') AND job_id IN ({parents})``."""
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresStatusSource(location, query=query)
    return SQLiteStatusSource(location, query=query)
