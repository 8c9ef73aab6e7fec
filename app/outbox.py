"""The transactional outbox: rows written with business data in one database transaction, relayed to Kafka in order."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol, TypeVar

import orjson
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from weir.app.settings import kafka_client_options

__all__ = [
    "OUTBOX_ID_HEADER",
    "OUTBOX_SOURCE_HEADER",
    "OUTBOX_ID_FIELD",
    "OutboxRow",
    "OutboxBatch",
    "OutboxTransaction",
    "RelayRound",
    "RelayDoorbell",
    "Outbox",
    "SQLiteOutbox",
    "PostgresOutbox",
    "open_outbox",
    "write",
    "Doorbell",
    "Decision",
    "StreamTrigger",
    "RelayStats",
    "OutboxRelay",
    "OutboxDedup",
    "outbox_id_of",
]

log = logging.getLogger("weir.outbox")

#: Kafka header carrying the outbox row id (decimal ASCII) of every message the relay publishes.
OUTBOX_ID_HEADER = "weir-outbox-id"
#: Kafka header naming the outbox the row came from (ids are unique per outbox only).
OUTBOX_SOURCE_HEADER = "weir-outbox-source"
#: Field that :meth:`OutboxTransaction.add_json` puts into the JSON object, so the id survives header-less hops.
OUTBOX_ID_FIELD = "outbox_id"

_T = TypeVar("_T")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutboxRow:
    """One outbox row: what the relay publishes. ``topic`` None means the relay's default topic."""

    id: int
    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    created_ms: int


@dataclass(frozen=True)
class OutboxBatch:
    """Pending rows in id order, read in one snapshot.

    ``drained_through``: every row with an id up to it is either in ``rows`` or already sent. ``drained``:
    no pending row exists beyond ``rows`` (so ``drained_through`` is the outbox's newest id).
    """

    rows: tuple[OutboxRow, ...]
    drained_through: int
    drained: bool


@dataclass(frozen=True)
class RelayRound:
    """A relay round whose Kafka transaction may have committed: rows ``first_id..last_id``, and where the
    broker put the round's first message (the witness: visible to a read_committed reader iff it committed)."""

    first_id: int
    last_id: int
    topic: str
    partition: int
    offset: int


class RelayDoorbell(abc.ABC):
    """What a relay holds while it runs: the outbox's one-relay lock and the writers' doorbell."""

    @abc.abstractmethod
    async def open(self, ring: Callable[[], None], lost: Callable[[BaseException], None]) -> None:
        """Take the lock (RuntimeError if another relay holds it), then call ``ring`` on every ring;
        ``lost`` if the doorbell (and with it the lock) is lost."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop listening and release the lock."""


class OutboxTransaction(Protocol):
    """The writer's side of one open transaction: business rows through ``connection``, outbox rows through ``add``."""

    @property
    def connection(self) -> Any: ...

    @property
    def newest_id(self) -> int | None: ...

    def add(
        self,
        value: bytes | None,
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int: ...

    def add_json(
        self,
        payload: Mapping[str, Any],
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int: ...


class Outbox(abc.ABC):
    """An outbox store. Ids grow in commit order and are never reused (the relay and the trigger rely on both)."""

    #: Names this outbox in the ``weir-outbox-source`` header.
    source: str

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[OutboxTransaction]:
        """One write transaction: commits on a normal exit, rolls back (business rows too) on an exception."""

    @abc.abstractmethod
    def fetch_batch(self, limit: int) -> OutboxBatch:
        """Up to ``limit`` pending rows, lowest ids first."""

    @abc.abstractmethod
    def mark_sent(self, ids: Sequence[int], *, now_ms: int) -> None:
        """Record that the broker committed these rows, and forget the recorded round (one transaction)."""

    @abc.abstractmethod
    def record_round(self, relay_round: RelayRound) -> None:
        """Remember a round before its Kafka transaction commits (replacing the one remembered before)."""

    @abc.abstractmethod
    def recorded_round(self) -> RelayRound | None:
        """The round remembered by :meth:`record_round` and not yet settled by :meth:`mark_sent`."""

    @abc.abstractmethod
    def forget_round(self) -> None:
        """Drop the remembered round (its Kafka transaction proved aborted)."""

    @abc.abstractmethod
    def newest_id(self) -> int:
        """The highest id ever committed (0 for an empty outbox)."""

    @abc.abstractmethod
    def pending_count(self) -> int:
        """How many rows wait to be published."""

    @abc.abstractmethod
    def oldest_pending_ms(self) -> int | None:
        """When the oldest row that waits to be published was written (ms since the epoch); None when none waits."""

    @abc.abstractmethod
    def purge_sent(self, *, sent_before_ms: int) -> int:
        """Delete rows sent before ``sent_before_ms``; returns how many."""

    @property
    @abc.abstractmethod
    def doorbell_path(self) -> str | None:
        """Where :func:`write` rings a relay of this outbox after the commit (None: the commit rings it itself)."""

    @abc.abstractmethod
    def relay_doorbell(self) -> RelayDoorbell:
        """The lock and the doorbell of a relay of this outbox."""

    def close(self) -> None:  # noqa: B027 - optional for stores without resources
        """Release connections."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS weir_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT,
    key BLOB,
    value BLOB,
    headers BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    sent_ms INTEGER
);
CREATE INDEX IF NOT EXISTS weir_outbox_pending ON weir_outbox (id) WHERE sent_ms IS NULL;
CREATE TABLE IF NOT EXISTS weir_outbox_round (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    first_id INTEGER NOT NULL,
    last_id INTEGER NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL
);
"""


def _to_bytes(text: bytes | str | None) -> bytes | None:
    return text.encode() if isinstance(text, str) else text


def _encode_headers(headers: Mapping[str, bytes | str] | None) -> bytes:
    # latin-1 maps every byte to one code point, so any header value survives the JSON round trip.
    pairs = [[name, (value.encode() if isinstance(value, str) else value).decode("latin-1")] for name, value in (headers or {}).items()]
    return orjson.dumps(pairs)


def _decode_headers(raw: bytes) -> tuple[tuple[str, bytes], ...]:
    return tuple((name, text.encode("latin-1")) for name, text in orjson.loads(raw))


class _SQLiteTransaction:
    def __init__(self, connection: sqlite3.Connection, now_ms: int) -> None:
        self._connection = connection
        self._now_ms = now_ms
        self._newest_id: int | None = None

    @property
    def connection(self) -> sqlite3.Connection:
        return self._connection

    @property
    def newest_id(self) -> int | None:
        return self._newest_id

    def add(
        self,
        value: bytes | None,
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int:
        cursor = self._connection.execute(
            "INSERT INTO weir_outbox (topic, key, value, headers, created_ms) VALUES (?, ?, ?, ?, ?)",
            (topic, _to_bytes(key), value, _encode_headers(headers), self._now_ms),
        )
        row_id = cursor.lastrowid
        if row_id is None:  # pragma: no cover - sqlite always reports it after an INSERT
            message = f"outbox {self._connection}: INSERT reported no row id"
            raise RuntimeError(message)
        self._newest_id = row_id
        return row_id

    def add_json(
        self,
        payload: Mapping[str, Any],
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int:
        """Add a JSON object that also carries its own row id under ``outbox_id``."""
        _refuse_own_id(payload)
        row_id = self.add(None, key=key, topic=topic, headers=headers)
        # The id exists only after the INSERT; the UPDATE is in the same transaction, so no one sees the gap.
        value = orjson.dumps({**payload, OUTBOX_ID_FIELD: row_id})
        self._connection.execute("UPDATE weir_outbox SET value = ? WHERE id = ?", (value, row_id))
        return row_id


class SQLiteOutbox(Outbox):
    """The embedded outbox: a table ``weir_outbox`` in the caller's SQLite database (WAL mode).

    Write transactions start with BEGIN IMMEDIATE, so SQLite runs them one at a time and AUTOINCREMENT ids
    become visible in id order; AUTOINCREMENT also never reuses an id after a purge. Each thread gets its
    own connection. The relay's doorbell is a Unix datagram socket next to the database file, its lock an
    flock beside it: the relay and the writers share a host.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        source: str | None = None,
        doorbell_path: str | Path | None = None,
        busy_timeout_ms: int = 30_000,
        synchronous: str = "FULL",
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            message = f"SQLiteOutbox {path}: synchronous={synchronous!r}, expected OFF, NORMAL, FULL or EXTRA"
            raise ValueError(message)
        self.path = Path(path)
        self.source = source or self.path.name
        self._doorbell_path = str(doorbell_path) if doorbell_path is not None else f"{self.path}.doorbell"
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = synchronous
        self._clock_ms = clock_ms
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        connection = self._connection()
        connection.execute("PRAGMA journal_mode=WAL")
        connection.executescript(_SCHEMA)

    @property
    def doorbell_path(self) -> str:
        return self._doorbell_path

    def relay_doorbell(self) -> RelayDoorbell:
        return _SocketDoorbell(self._doorbell_path, self.source)

    def _connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            # isolation_level=None: no implicit transactions; every transaction below is explicit.
            # check_same_thread=False only so close() can close every thread's connection; each is used by one thread.
            connection = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            connection.execute(f"PRAGMA synchronous={self._synchronous}")
            self._local.connection = connection
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_SQLiteTransaction]:
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")
        committed = False
        try:
            yield _SQLiteTransaction(connection, self._clock_ms())
            connection.execute("COMMIT")
            committed = True
        finally:
            if not committed:
                connection.execute("ROLLBACK")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        connection = self._connection()
        connection.execute("BEGIN")
        try:
            yield connection
        finally:
            connection.execute("COMMIT")

    def fetch_batch(self, limit: int) -> OutboxBatch:
        if limit < 1:
            message = f"outbox {self.path}: fetch_batch(limit={limit}), expected at least 1"
            raise ValueError(message)
        with self._read() as connection:  # one snapshot for the rows and the high-water mark
            found = connection.execute(
                "SELECT id, topic, key, value, headers, created_ms FROM weir_outbox WHERE sent_ms IS NULL ORDER BY id LIMIT ?",
                (limit,),
            ).fetchall()
            newest = self._newest_id(connection)
        rows = tuple(
            OutboxRow(row_id, topic, key, value, _decode_headers(headers), created) for row_id, topic, key, value, headers, created in found
        )
        drained = len(rows) < limit
        return OutboxBatch(rows, newest if drained else rows[-1].id, drained)

    def mark_sent(self, ids: Sequence[int], *, now_ms: int) -> None:
        if not ids:
            return
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.executemany(
                "UPDATE weir_outbox SET sent_ms = ? WHERE id = ? AND sent_ms IS NULL", [(now_ms, row_id) for row_id in ids]
            )
            connection.execute("DELETE FROM weir_outbox_round")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def record_round(self, relay_round: RelayRound) -> None:
        self._connection().execute(
            "INSERT OR REPLACE INTO weir_outbox_round (singleton, first_id, last_id, topic, partition, offset) VALUES (1, ?, ?, ?, ?, ?)",
            (relay_round.first_id, relay_round.last_id, relay_round.topic, relay_round.partition, relay_round.offset),
        )

    def recorded_round(self) -> RelayRound | None:
        found = self._connection().execute("SELECT first_id, last_id, topic, partition, offset FROM weir_outbox_round").fetchone()
        return None if found is None else RelayRound(*found)

    def forget_round(self) -> None:
        self._connection().execute("DELETE FROM weir_outbox_round")

    @staticmethod
    def _newest_id(connection: sqlite3.Connection) -> int:
        # sqlite_sequence, not max(id): it still counts rows that were purged.
        found = connection.execute("SELECT seq FROM sqlite_sequence WHERE name = 'weir_outbox'").fetchone()
        return int(found[0]) if found else 0

    def newest_id(self) -> int:
        return self._newest_id(self._connection())

    def pending_count(self) -> int:
        return int(self._connection().execute("SELECT count(*) FROM weir_outbox WHERE sent_ms IS NULL").fetchone()[0])

    def oldest_pending_ms(self) -> int | None:
        found = self._connection().execute("SELECT created_ms FROM weir_outbox WHERE sent_ms IS NULL ORDER BY id LIMIT 1").fetchone()
        return None if found is None else int(found[0])

    def purge_sent(self, *, sent_before_ms: int) -> int:
        connection = self._connection()
        cursor = connection.execute("DELETE FROM weir_outbox WHERE sent_ms IS NOT NULL AND sent_ms < ?", (sent_before_ms,))
        return int(cursor.rowcount)

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()


_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS weir_outbox (
    id BIGINT PRIMARY KEY,
    topic TEXT,
    key BYTEA,
    value BYTEA,
    headers BYTEA NOT NULL,
    created_ms BIGINT NOT NULL,
    sent_ms BIGINT
);
CREATE INDEX IF NOT EXISTS weir_outbox_pending ON weir_outbox (id) WHERE sent_ms IS NULL;
CREATE TABLE IF NOT EXISTS weir_outbox_head (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    newest_id BIGINT NOT NULL
);
INSERT INTO weir_outbox_head (singleton, newest_id) VALUES (TRUE, 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS weir_outbox_round (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    first_id BIGINT NOT NULL,
    last_id BIGINT NOT NULL,
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" BIGINT NOT NULL
)
"""

#: Advisory lock keys of weir's outbox (``'weir'`` in ASCII, then what the lock guards), high 32 bits of a bigint.
_PG_LOCK_TAG = 0x77656972
_PG_SCHEMA_LOCK = _PG_LOCK_TAG << 32


def _refuse_own_id(payload: Mapping[str, Any]) -> None:
    """``add_json`` of either outbox: the payload may not carry the row-id field the outbox sets itself."""
    if OUTBOX_ID_FIELD in payload:
        message = f"outbox add_json: the payload already has a field {OUTBOX_ID_FIELD!r}, which the outbox sets itself"
        raise ValueError(message)


class _PostgresTransaction:
    def __init__(self, connection: Any, now_ms: int) -> None:
        self._connection = connection
        self._now_ms = now_ms
        self._newest_id: int | None = None

    @property
    def connection(self) -> Any:
        return self._connection

    @property
    def newest_id(self) -> int | None:
        return self._newest_id

    def _next_id(self) -> int:
        # The head row's lock is held until COMMIT: writers take ids one transaction at a time, so ids become
        # visible in id order, and a rolled-back transaction gives its ids back (no gap).
        found = self._connection.execute("UPDATE weir_outbox_head SET newest_id = newest_id + 1 RETURNING newest_id").fetchone()
        self._newest_id = int(found[0])
        return self._newest_id

    def add(
        self,
        value: bytes | None,
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int:
        row_id = self._next_id()
        self._connection.execute(
            "INSERT INTO weir_outbox (id, topic, key, value, headers, created_ms) VALUES (%s, %s, %s, %s, %s, %s)",
            (row_id, topic, _to_bytes(key), value, _encode_headers(headers), self._now_ms),
        )
        return row_id

    def add_json(
        self,
        payload: Mapping[str, Any],
        *,
        key: bytes | str | None = None,
        topic: str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
    ) -> int:
        """Add a JSON object that also carries its own row id under ``outbox_id``."""
        _refuse_own_id(payload)
        row_id = self._next_id()
        self._connection.execute(
            "INSERT INTO weir_outbox (id, topic, key, value, headers, created_ms) VALUES (%s, %s, %s, %s, %s, %s)",
            (row_id, topic, _to_bytes(key), orjson.dumps({**payload, OUTBOX_ID_FIELD: row_id}), _encode_headers(headers), self._now_ms),
        )
        return row_id


class PostgresOutbox(Outbox):
    """The outbox in PostgreSQL (psycopg 3): tables ``weir_outbox``, ``weir_outbox_head``, ``weir_outbox_round``
    in the schema the URL's search_path names (``public`` by default).

    Ids come from the one-row table ``weir_outbox_head``, incremented inside the writer's transaction: its
    row lock serialises writers from their first outbox row to their COMMIT (business rows written before
    the first ``add`` do not wait), so ids are dense, never reused, and visible in id order, which the relay
    relies on. Writers use the default isolation, READ COMMITTED (under REPEATABLE READ a second writer
    would fail to serialise). A transaction that added rows sends ``NOTIFY <channel>`` before its COMMIT;
    PostgreSQL delivers it only once the commit is done, to a relay on any host (LISTEN). The relay's lock
    is a session advisory lock on its listening connection: released by the server if the relay dies.
    Each thread gets its own connection (autocommit; every transaction is explicit).
    """

    def __init__(
        self,
        url: str,
        *,
        source: str | None = None,
        channel: str = "weir_outbox",
        connect_timeout_s: int = 10,
        clock_ms: Callable[[], int] = _now_ms,
    ) -> None:
        self.url = url
        try:
            dbname = conninfo_to_dict(url).get("dbname")
        except psycopg.ProgrammingError as error:
            message = f"PostgresOutbox: {url!r} is not a PostgreSQL URL ({error})"
            raise ValueError(message) from None
        self.source = source or f"postgresql-{dbname or 'default'}"
        self.channel = channel
        self._connect_timeout_s = connect_timeout_s
        self._clock_ms = clock_ms
        self._local = threading.local()
        self._connections: list[Any] = []
        self._connections_lock = threading.Lock()
        connection = self._connection()
        with connection.transaction():
            # Two processes creating the tables at once would collide in the catalogue: one at a time. Once they
            # exist, no DDL runs: CREATE INDEX IF NOT EXISTS still takes a SHARE lock on the table before it sees
            # the index, and its schema transaction then waits for the head row that a writer holds while the
            # writer waits for that table lock (a deadlock between two processes opening the same outbox).
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_SCHEMA_LOCK,))
            names = ("weir_outbox", "weir_outbox_pending", "weir_outbox_head", "weir_outbox_round")
            found = connection.execute("SELECT " + ", ".join(f"to_regclass('{name}')" for name in names)).fetchone()
            if not all(found):
                connection.execute(_PG_SCHEMA)
        self.table_oid = int(connection.execute("SELECT 'weir_outbox'::regclass::oid").fetchone()[0])

    @property
    def doorbell_path(self) -> None:
        return None

    def relay_doorbell(self) -> RelayDoorbell:
        return _NotifyDoorbell(self)

    def _connect(self, *, autocommit: bool = True) -> Any:
        return psycopg.connect(self.url, autocommit=autocommit, connect_timeout=self._connect_timeout_s)

    def _connection(self) -> Any:
        connection = getattr(self._local, "connection", None)
        if connection is None or connection.closed:
            connection = self._connect()
            self._local.connection = connection
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    @contextlib.contextmanager
    def transaction(self) -> Iterator[_PostgresTransaction]:
        connection = self._connection()
        with connection.transaction():
            transaction = _PostgresTransaction(connection, self._clock_ms())
            yield transaction
            if transaction.newest_id is not None:
                connection.execute("SELECT pg_notify(%s, %s)", (self.channel, str(transaction.newest_id)))

    def fetch_batch(self, limit: int) -> OutboxBatch:
        if limit < 1:
            message = f"outbox {self.source}: fetch_batch(limit={limit}), expected at least 1"
            raise ValueError(message)
        connection = self._connection()
        with connection.transaction():  # one snapshot for the rows and the high-water mark
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            found = connection.execute(
                "SELECT id, topic, key, value, headers, created_ms FROM weir_outbox WHERE sent_ms IS NULL ORDER BY id LIMIT %s",
                (limit,),
            ).fetchall()
            newest = int(connection.execute("SELECT newest_id FROM weir_outbox_head").fetchone()[0])
        rows = tuple(
            OutboxRow(int(row_id), topic, key, value, _decode_headers(headers), int(created))
            for row_id, topic, key, value, headers, created in found
        )
        drained = len(rows) < limit
        return OutboxBatch(rows, newest if drained else rows[-1].id, drained)

    def mark_sent(self, ids: Sequence[int], *, now_ms: int) -> None:
        if not ids:
            return
        connection = self._connection()
        with connection.transaction():
            connection.execute("UPDATE weir_outbox SET sent_ms = %s WHERE id = ANY(%s) AND sent_ms IS NULL", (now_ms, list(ids)))
            connection.execute("DELETE FROM weir_outbox_round")

    def record_round(self, relay_round: RelayRound) -> None:
        self._connection().execute(
            'INSERT INTO weir_outbox_round (first_id, last_id, topic, partition, "offset") VALUES (%s, %s, %s, %s, %s) '
            "ON CONFLICT (singleton) DO UPDATE SET first_id = EXCLUDED.first_id, last_id = EXCLUDED.last_id, "
            'topic = EXCLUDED.topic, partition = EXCLUDED.partition, "offset" = EXCLUDED."offset"',
            (relay_round.first_id, relay_round.last_id, relay_round.topic, relay_round.partition, relay_round.offset),
        )

    def recorded_round(self) -> RelayRound | None:
        found = self._connection().execute('SELECT first_id, last_id, topic, partition, "offset" FROM weir_outbox_round').fetchone()
        return None if found is None else RelayRound(*(int(found[0]), int(found[1]), found[2], int(found[3]), int(found[4])))

    def forget_round(self) -> None:
        self._connection().execute("DELETE FROM weir_outbox_round")

    def newest_id(self) -> int:
        return int(self._connection().execute("SELECT newest_id FROM weir_outbox_head").fetchone()[0])

    def pending_count(self) -> int:
        return int(self._connection().execute("SELECT count(*) FROM weir_outbox WHERE sent_ms IS NULL").fetchone()[0])

    def oldest_pending_ms(self) -> int | None:
        found = self._connection().execute("SELECT created_ms FROM weir_outbox WHERE sent_ms IS NULL ORDER BY id LIMIT 1").fetchone()
        return None if found is None else int(found[0])

    def purge_sent(self, *, sent_before_ms: int) -> int:
        cursor = self._connection().execute("DELETE FROM weir_outbox WHERE sent_ms IS NOT NULL AND sent_ms < %s", (sent_before_ms,))
        return int(cursor.rowcount)

    def close(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()


class _SocketDoorbell(RelayDoorbell):
    """A SQLite outbox's relay side: an flock next to the database, and the :class:`Doorbell` socket."""

    def __init__(self, path: str, source: str) -> None:
        self.path = path
        self.source = source
        self._lock: Any = None
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _take_lock(self) -> Any:
        handle = open(f"{self.path}.lock", "a+b")  # noqa: SIM115 - held until close(); the kernel drops it if the relay dies
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            message = f"outbox relay for {self.source}: another relay holds {self.path}.lock; one relay per outbox keeps the order"
            raise RuntimeError(message) from None
        return handle

    async def open(self, ring: Callable[[], None], lost: Callable[[BaseException], None]) -> None:
        self._lock = self._take_lock()  # a local file, never waited for (LOCK_NB)
        sock = Doorbell(self.path).listen()
        self._socket = sock
        self._loop = asyncio.get_running_loop()

        def readable() -> None:
            rang = False
            while True:
                try:
                    sock.recv(64)
                except (BlockingIOError, InterruptedError):
                    break
                rang = True
            if rang:
                ring()

        self._loop.add_reader(sock.fileno(), readable)

    async def close(self) -> None:
        if self._socket is not None and self._loop is not None:
            self._loop.remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class _NotifyDoorbell(RelayDoorbell):
    """A PostgreSQL outbox's relay side: one connection that holds the relay's advisory lock and LISTENs."""

    def __init__(self, outbox: PostgresOutbox) -> None:
        self.outbox = outbox
        self._connection: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lock_key = 0

    async def open(self, ring: Callable[[], None], lost: Callable[[BaseException], None]) -> None:
        outbox = self.outbox
        connection = await psycopg.AsyncConnection.connect(outbox.url, autocommit=True, connect_timeout=outbox._connect_timeout_s)
        try:
            lock_key = self._lock_key = (_PG_LOCK_TAG << 32) | outbox.table_oid
            cursor = await connection.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,))
            found = await cursor.fetchone()
            if not found or not found[0]:
                message = (
                    f"outbox relay for {outbox.source}: another relay holds the advisory lock {lock_key} of this outbox's "
                    "database; one relay per outbox keeps the order"
                )
                raise RuntimeError(message)
            await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(outbox.channel)))
        except BaseException:
            await connection.close()
            raise
        self._connection = connection

        async def listen() -> None:
            try:
                async for _notify in connection.notifies():
                    ring()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the connection, and with it the relay's lock, is gone
                lost(error)

        self._task = asyncio.get_running_loop().create_task(listen())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._connection is not None:
            # Released here, not only by the end of the session: the server ends a closed connection's session (and
            # frees its locks) a moment after the client has gone, and a relay opened at once found the lock still held.
            with contextlib.suppress(psycopg.Error):
                await self._connection.execute("SELECT pg_advisory_unlock(%s)", (self._lock_key,))
            await self._connection.close()  # ends the session: the advisory lock is released, if it was not yet
            self._connection = None


def open_outbox(location: str, **options: Any) -> Outbox:
    """The outbox at ``location`` (``settings.outbox_db``): a ``postgresql://`` URL or a SQLite file path."""
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresOutbox(location, **options)
    return SQLiteOutbox(location, **options)


# --------------------------------------------------------------------------------------------------
# Signalling the relay
# --------------------------------------------------------------------------------------------------


class Doorbell:
    """A relay's cross-process doorbell: a Unix datagram socket (local only, no broker needed to write).

    A ring is one non-blocking datagram. It never fails the writer: with no relay listening the rows wait
    for the next relay's first drain. The datagram's text is only a hint; the relay answers any ring by
    reading the newest id from the database, so a ring that finds the relay's queue full loses nothing
    (the queued rings are read after this commit, and so is that id).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def ring(self, offset: int) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            # No relay (ENOENT, ECONNREFUSED) or a full queue (EAGAIN): see the class docstring.
            with contextlib.suppress(OSError):
                sock.sendto(str(offset).encode(), self.path)

    def listen(self) -> socket.socket:
        """Bind the relay's end (replacing a stale socket file left by a crashed relay)."""
        if len(os.fsencode(self.path)) > 100:
            message = f"outbox doorbell {self.path!r}: a Unix socket path must be under 100 bytes; pass a shorter doorbell_path"
            raise ValueError(message)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(self.path)
        return sock


@contextlib.contextmanager
def write(outbox: Outbox, *, notify: Callable[[int], object] | None = None) -> Iterator[OutboxTransaction]:
    """One transaction for the caller's business rows and outbox rows; after COMMIT, signal the relay.

    ``notify`` receives the newest row id written: pass ``relay.signal`` when the relay runs in this
    process; the default rings the outbox's doorbell, which works from any process on the host.
    """
    with outbox.transaction() as transaction:
        yield transaction
    newest = transaction.newest_id
    if newest is None:
        return
    if notify is None:
        path = outbox.doorbell_path
        if path is None:
            return
        notify = Doorbell(path).ring
    try:
        notify(newest)
    except Exception:  # the rows are committed; a relay's first drain or safety timer still finds them
        log.warning("outbox %s: signalling row %d failed", outbox.source, newest, exc_info=True)


# --------------------------------------------------------------------------------------------------
# The stream trigger (pure)
# --------------------------------------------------------------------------------------------------


class Decision(Enum):
    """What the trigger tells the relay."""

    WAKE = "wake"  # run now (from sleep, or do not go to sleep)
    SLEEP = "sleep"  # sleep until woken
    NOTHING = "nothing"  # no change


@dataclass(frozen=True)
class StreamTrigger:
    """When a sleeping relay must wake, from two events (no clock, no I/O).

    ``on_signal(offset)``: a writer committed rows up to ``offset``. Remembered as the newest offset; wakes
    the relay only if it sleeps and the offset is beyond what it processed, so a running relay is never
    woken and a stale signal does not wake anyone.
    ``on_going_to_sleep(processed)``: the relay has published every row up to ``processed``. If a newer
    offset was signalled meanwhile it must not sleep (WAKE), otherwise it sleeps. With writers that
    signal after COMMIT this leaves no gap for a lost wake-up: a row is either read by the relay's last
    drain or its signal arrives later than the drain's read began.
    ``on_safety_timer()``: the documented safety net (a long timeout) wakes a sleeping relay.
    """

    newest_offset: int = 0
    processed_offset: int = 0
    sleeping: bool = False  # a relay starts running: its first drain needs no signal

    def on_signal(self, offset: int) -> tuple[StreamTrigger, Decision]:
        newest = max(self.newest_offset, offset)
        if self.sleeping and newest > self.processed_offset:
            return replace(self, newest_offset=newest, sleeping=False), Decision.WAKE
        return replace(self, newest_offset=newest), Decision.NOTHING

    def on_going_to_sleep(self, processed_offset: int) -> tuple[StreamTrigger, Decision]:
        if self.sleeping:
            message = f"stream trigger: the relay reported going to sleep (processed {processed_offset}) while it already sleeps"
            raise ValueError(message)
        processed = max(self.processed_offset, processed_offset)
        if self.newest_offset > processed:
            return replace(self, processed_offset=processed), Decision.WAKE
        return replace(self, processed_offset=processed, sleeping=True), Decision.SLEEP

    def on_safety_timer(self) -> tuple[StreamTrigger, Decision]:
        if self.sleeping:
            return replace(self, sleeping=False), Decision.WAKE
        return self, Decision.NOTHING


# --------------------------------------------------------------------------------------------------
# The relay (asyncio shell)
# --------------------------------------------------------------------------------------------------


@dataclass
class RelayStats:
    """Counters of one relay run."""

    rounds: int = 0
    rows_published: int = 0
    sleeps: int = 0
    signal_wakes: int = 0
    safety_wakes: int = 0
    publish_failures: int = 0
    ignored_signals: int = 0


class OutboxRelay:
    """Publishes an outbox to Kafka in id order; sleeps when drained; woken by the stream trigger.

    Design. One relay per outbox (the outbox's relay lock refuses a second one: two relays would
    interleave). A round reads up to ``batch_size`` pending rows and sends them in id order in one Kafka
    transaction (transactional id ``weir-outbox-relay.<source>``). Before committing it, the relay records
    the round in the database: its rows and the offset of its first message (the witness). After the
    commit, one database transaction marks the rows sent and forgets the round. The Kafka key is the row's
    key (its aggregate), so order holds per aggregate, i.e. per partition; there is no order across
    partitions.

    Exactly once for a read_committed consumer, across a SIGKILL anywhere: a restarted relay's producer
    ends the dead one's transaction (it aborts, unless its commit had begun, which it completes); a round
    still recorded then either committed (its witness is visible to a read_committed reader: the rows are
    marked sent and not published again) or aborted (the round is forgotten and its rows published again).
    A failed send or commit is settled the same way before the round is retried. A read_uncommitted
    consumer can also see the aborted copies: each message carries ``weir-outbox-id`` and
    ``weir-outbox-source`` headers, and :class:`OutboxDedup` drops them.

    Waking. Same-process writers call :meth:`signal` (thread-safe). Other processes ring the outbox's
    doorbell (SQLite: a Unix datagram socket; PostgreSQL: NOTIFY at commit, from any host): the relay then
    reads the newest id from the database and signals that. The relay waits on an asyncio event, not a
    poll; ``safety_timeout_s`` (default 30 s) re-checks the outbox only as a safety net, and is counted in
    ``stats.safety_wakes``.
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        bootstrap: str,
        topic: str,
        batch_size: int,
        safety_timeout_s: float = 30.0,
        retry_backoff_s: float = 1.0,
        linger_ms: int = 5,
        settle_timeout_s: float = 60.0,
        on_published: Callable[[Sequence[OutboxRow]], object] | None = None,
        on_sleep: Callable[[int], object] | None = None,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            message = f"outbox relay for {outbox.source}: batch_size={batch_size}, expected at least 1"
            raise ValueError(message)
        self.outbox = outbox
        self.bootstrap = bootstrap
        self.topic = topic
        self.batch_size = batch_size
        self.safety_timeout_s = safety_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.linger_ms = linger_ms
        self.settle_timeout_s = settle_timeout_s
        self.transactional_id = f"weir-outbox-relay.{outbox.source}"
        self.stats = RelayStats()
        self._on_published = on_published
        self._on_sleep = on_sleep
        # the environment's Kafka security options (WEIR_KAFKA_*), unless the caller's options say otherwise
        self._client_options = kafka_client_options()
        self._producer_options = {**self._client_options, **(producer_options or {})}
        self._trigger = StreamTrigger()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._stop_requested = False
        self._failure: BaseException | None = None
        self._producer: Any = None
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weir-outbox-db")
        self._doorbell_dirty = False
        self._doorbell_task: asyncio.Task[None] | None = None

    @property
    def trigger(self) -> StreamTrigger:
        return self._trigger

    # -- signals (any thread) ------------------------------------------------------------------

    def signal(self, offset: int) -> None:
        """A writer committed rows up to ``offset``. Safe from any thread; a no-op before run() starts
        (its first drain reads what was committed) and after it ends."""
        loop = self._loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._on_signal(offset)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the relay has ended
                loop.call_soon_threadsafe(self._on_signal, offset)

    def stop(self) -> None:
        """Finish the round in progress, then end run(). Safe from any thread and from signal handlers."""
        loop = self._loop
        self._stop_requested = True
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    def _on_signal(self, offset: int) -> None:
        self._trigger, decision = self._trigger.on_signal(offset)
        if decision is Decision.WAKE:
            self.stats.signal_wakes += 1
            self._wake.set()

    def _on_doorbell(self) -> None:
        self._doorbell_dirty = True
        if self._doorbell_task is None:
            self._doorbell_task = asyncio.get_running_loop().create_task(self._answer_doorbell())

    def _on_doorbell_lost(self, error: BaseException) -> None:
        # Without its doorbell the relay has also lost its lock: another relay may start. It stops; run() raises.
        log.error("outbox %s: the relay's doorbell and lock were lost (%r); stopping", self.outbox.source, error)
        self._failure = error
        self.stop()

    async def _answer_doorbell(self) -> None:
        # A ring during the read may be for a row committed after it: read again (the dirty flag).
        try:
            while self._doorbell_dirty:
                self._doorbell_dirty = False
                self._on_signal(await self._in_db(self.outbox.newest_id))
        finally:
            self._doorbell_task = None

    # -- the loop --------------------------------------------------------------------------------

    async def _in_db(self, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db, functools.partial(call, *args, **kwargs))

    async def run(self) -> None:
        """Relay until :meth:`stop`. Drains at once (rows committed while no relay ran), then sleeps and wakes."""
        loop = asyncio.get_running_loop()
        doorbell = self.outbox.relay_doorbell()
        # The doorbell listens before the first read: a ring that found no listener was rung before it.
        await doorbell.open(self._on_doorbell, self._on_doorbell_lost)
        try:
            self._loop = loop
            log.info(
                "outbox relay ready: outbox=%s topic=%s doorbell=%s batch=%d",
                self.outbox.source,
                self.topic,
                type(doorbell).__name__,
                self.batch_size,
            )
            recorded = await self._in_db(self.outbox.recorded_round)
            if recorded is None or await self._settle(recorded):
                await self._relay()
        finally:
            self._loop = None
            await doorbell.close()
            if self._doorbell_task is not None:
                self._doorbell_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._doorbell_task
            await self._close_producer()
            self._db.shutdown(wait=True)
            log.info("outbox relay stopped: %s", self.stats)
        if self._failure is not None:
            message = f"outbox relay for {self.outbox.source}: stopped because its doorbell and lock were lost"
            raise RuntimeError(message) from self._failure

    async def _relay(self) -> None:
        while not self._stop_requested:
            processed = await self._drain()
            if self._stop_requested:
                return
            self._trigger, decision = self._trigger.on_going_to_sleep(processed)
            if decision is Decision.WAKE:
                continue
            self.stats.sleeps += 1
            self._wake.clear()  # nothing ran since the decision: no wake-up can be lost here
            if self._on_sleep is not None:
                self._on_sleep(processed)
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.safety_timeout_s)
            except TimeoutError:
                self._trigger, decision = self._trigger.on_safety_timer()
                if decision is Decision.WAKE:
                    self.stats.safety_wakes += 1

    async def _drain(self) -> int:
        """Publish pending rows until the outbox is drained; return the offset processed."""
        while True:
            signalled_before_read = self._trigger.newest_offset
            batch = await self._in_db(self.outbox.fetch_batch, self.batch_size)
            if batch.rows:
                if not await self._publish(batch.rows):
                    return batch.drained_through if batch.drained else batch.rows[0].id - 1
                await self._in_db(self.outbox.mark_sent, [row.id for row in batch.rows], now_ms=_now_ms())
                self.stats.rows_published += len(batch.rows)
                self.stats.rounds += 1
                if self._on_published is not None:
                    self._on_published(batch.rows)
            if batch.drained or self._stop_requested:
                processed = batch.drained_through
                if batch.drained and processed < signalled_before_read:
                    # A signal received before this read began names a row this read would have seen:
                    # the offset is not one of this outbox's ids. Without this the relay would spin.
                    log.warning(
                        "outbox %s: signal offset %d is beyond its newest id %d; ignored",
                        self.outbox.source,
                        signalled_before_read,
                        processed,
                    )
                    self.stats.ignored_signals += 1
                    processed = signalled_before_read
                return processed

    async def _publish(self, rows: Sequence[OutboxRow]) -> bool:
        """Send ``rows`` in order in one Kafka transaction and commit it; retry on failure. True: the rows
        are committed on the broker (by this attempt or an earlier one). False: stopped first."""
        in_doubt: RelayRound | None = None  # a recorded attempt whose commit may have happened
        while True:
            try:
                if in_doubt is not None:
                    if await self._settle_attempt(in_doubt):
                        return True
                    in_doubt = None
                producer = await self._ensure_producer()
                await producer.begin_transaction()
                acks = []
                for row in rows:
                    headers = [*row.headers, (OUTBOX_ID_HEADER, str(row.id).encode()), (OUTBOX_SOURCE_HEADER, self.outbox.source.encode())]
                    acks.append(await producer.send(row.topic or self.topic, value=row.value, key=row.key, headers=headers))
                sent = await asyncio.gather(*acks)
                witness = RelayRound(rows[0].id, rows[-1].id, sent[0].topic, sent[0].partition, sent[0].offset)
                # Recorded before the commit: whatever happens from here on, a restart can tell whether it committed.
                await self._in_db(self.outbox.record_round, witness)
                in_doubt = witness
                await producer.commit_transaction()
                return True
            except Exception:
                self.stats.publish_failures += 1
                log.exception("outbox %s: publishing rows %d..%d failed; retrying the round", self.outbox.source, rows[0].id, rows[-1].id)
                await self._abort_and_close_producer()
                if self._stop_requested:
                    return False
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # a stop() cuts the backoff short
                    await asyncio.wait_for(self._wake.wait(), timeout=self.retry_backoff_s)
                if self._stop_requested:
                    return False

    async def _settle(self, recorded: RelayRound) -> bool:
        """At start: settle the round a previous relay recorded. False: stopped first."""
        while not self._stop_requested:
            try:
                if await self._settle_attempt(recorded):
                    log.info(
                        "outbox %s: rows %d..%d were committed before the restart", self.outbox.source, recorded.first_id, recorded.last_id
                    )
                    ids = list(range(recorded.first_id, recorded.last_id + 1))
                    await self._in_db(self.outbox.mark_sent, ids, now_ms=_now_ms())
                else:
                    log.info(
                        "outbox %s: rows %d..%d were not committed; publishing them again",
                        self.outbox.source,
                        recorded.first_id,
                        recorded.last_id,
                    )
                    await self._in_db(self.outbox.forget_round)
                return True
            except Exception:
                log.exception("outbox %s: settling the recorded round %s failed; retrying", self.outbox.source, recorded)
                await self._abort_and_close_producer()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.retry_backoff_s)
        return False

    async def _settle_attempt(self, recorded: RelayRound) -> bool:
        """Whether ``recorded``'s transaction committed. A new producer first ends it (the broker completes a
        commit that had begun and aborts anything else); then its witness is visible iff it committed."""
        await self._ensure_producer()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            group_id=None,
            **self._client_options,
        )
        await consumer.start()
        try:
            place = TopicPartition(recorded.topic, recorded.partition)
            consumer.assign([place])
            consumer.seek(place, recorded.offset)
            deadline = asyncio.get_running_loop().time() + self.settle_timeout_s
            while asyncio.get_running_loop().time() < deadline:
                for message in (await consumer.getmany(place, timeout_ms=500)).get(place, []):
                    # The first visible message at or after the witness's offset: the witness itself iff committed.
                    return message.offset == recorded.offset and outbox_id_of(message.headers) == (self.outbox.source, recorded.first_id)
                if await consumer.position(place) > recorded.offset:
                    return False  # read past the witness's offset without seeing it: aborted
            message = f"outbox relay for {self.outbox.source}: no outcome for the recorded round {recorded} after {self.settle_timeout_s}s"
            raise RuntimeError(message)
        finally:
            await consumer.stop()

    async def _ensure_producer(self) -> Any:
        if self._producer is None:
            options: dict[str, Any] = {"linger_ms": self.linger_ms, **self._producer_options}
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=self.transactional_id, acks="all", **options)
            try:
                await producer.start()  # fences an earlier producer of this outbox and ends its transaction
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

    async def _abort_and_close_producer(self) -> None:
        # Aborting now frees read_committed consumers at once; a restarted producer would abort it too.
        producer = self._producer
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.abort_transaction(), timeout=10)
        await self._close_producer()

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except Exception:
                log.warning("outbox %s: stopping the producer failed", self.outbox.source, exc_info=True)


# --------------------------------------------------------------------------------------------------
# Consumer side
# --------------------------------------------------------------------------------------------------


def outbox_id_of(headers: Sequence[tuple[str, bytes]] | None) -> tuple[str, int] | None:
    """(source, outbox id) from a message's headers, or None for a message that did not come from an outbox."""
    source = ""
    row_id: int | None = None
    for name, value in headers or ():
        if name == OUTBOX_ID_HEADER:
            row_id = int(value)
        elif name == OUTBOX_SOURCE_HEADER:
            source = value.decode()
    return None if row_id is None else (source, row_id)


@dataclass
class OutboxDedup:
    """Drops republished outbox messages on the consumer side, in O(partitions) memory.

    The relay publishes one outbox's rows in id order, and a republished round starts again from an id
    already published, so on each (source, topic, partition) a message whose id is not above the highest
    seen is a duplicate. A consumer that restarts from a committed offset keeps ``high_water`` next to
    that offset (e.g. in the same table or transaction); messages without outbox headers pass.
    """

    high_water: dict[tuple[str, str, int], int] = field(default_factory=dict)
    duplicates: int = 0

    def is_new(self, topic: str, partition: int, headers: Sequence[tuple[str, bytes]] | None) -> bool:
        found = outbox_id_of(headers)
        if found is None:
            return True
        source, row_id = found
        place = (source, topic, partition)
        if row_id <= self.high_water.get(place, 0):
            self.duplicates += 1
            return False
        self.high_water[place] = row_id
        return True

    def accept(self, message: Any) -> bool:
        """:meth:`is_new` for an aiokafka ``ConsumerRecord`` (or anything with topic, partition and headers)."""
        return self.is_new(message.topic, message.partition, message.headers)
