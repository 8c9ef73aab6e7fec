"""The transactional outbox: rows written with business data in one local transaction, relayed to Kafka in order."""

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
from aiokafka import AIOKafkaProducer

from app.settings import kafka_client_options

__all__ = [
    "OUTBOX_ID_HEADER",
    "OUTBOX_SOURCE_HEADER",
    "OUTBOX_ID_FIELD",
    "OutboxRow",
    "OutboxBatch",
    "OutboxTransaction",
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
        """Record that the broker acknowledged these rows."""

    @abc.abstractmethod
    def newest_id(self) -> int:
        """The highest id ever committed (0 for an empty outbox)."""

    @abc.abstractmethod
    def pending_count(self) -> int:
        """How many rows wait to be published."""

    @abc.abstractmethod
    def purge_sent(self, *, sent_before_ms: int) -> int:
        """Delete rows sent before ``sent_before_ms``; returns how many."""

    @property
    @abc.abstractmethod
    def doorbell_path(self) -> str | None:
        """Where a relay of this outbox listens for cross-process signals (None: it does not)."""

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
        if OUTBOX_ID_FIELD in payload:
            message = f"outbox add_json: the payload already has a field {OUTBOX_ID_FIELD!r}, which the outbox sets itself"
            raise ValueError(message)
        row_id = self.add(None, key=key, topic=topic, headers=headers)
        # The id exists only after the INSERT; the UPDATE is in the same transaction, so no one sees the gap.
        value = orjson.dumps({**payload, OUTBOX_ID_FIELD: row_id})
        self._connection.execute("UPDATE weir_outbox SET value = ? WHERE id = ?", (value, row_id))
        return row_id


class SQLiteOutbox(Outbox):
    """The embedded outbox: a table ``weir_outbox`` in the caller's SQLite database (WAL mode).

    Write transactions start with BEGIN IMMEDIATE, so SQLite runs them one at a time and AUTOINCREMENT ids
    become visible in id order; AUTOINCREMENT also never reuses an id after a purge. Each thread gets its
    own connection. The relay's doorbell is a Unix datagram socket next to the database file.
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
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    @staticmethod
    def _newest_id(connection: sqlite3.Connection) -> int:
        # sqlite_sequence, not max(id): it still counts rows that were purged.
        found = connection.execute("SELECT seq FROM sqlite_sequence WHERE name = 'weir_outbox'").fetchone()
        return int(found[0]) if found else 0

    def newest_id(self) -> int:
        return self._newest_id(self._connection())

    def pending_count(self) -> int:
        return int(self._connection().execute("SELECT count(*) FROM weir_outbox WHERE sent_ms IS NULL").fetchone()[0])

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


class PostgresOutbox(Outbox):
    """PostgreSQL behind the same interface: NOT IMPLEMENTED (no PostgreSQL driver is a weir dependency yet).

    What it needs beyond SQLite: sequence values are taken at INSERT, not at COMMIT, so a lower id can
    become visible after a higher one. The relay must then order by commit (for instance take a
    transaction-level advisory lock in ``transaction()`` so writers commit one at a time, or publish
    only ids below the oldest running transaction's ``pg_snapshot_xmin``); the doorbell would be
    LISTEN/NOTIFY issued inside the writer's transaction, which PostgreSQL delivers only on commit.
    """

    def __init__(self, url: str) -> None:
        message = f"outbox {url!r}: the PostgreSQL outbox is an interface stub; use a SQLite path for WEIR_OUTBOX_DB"
        raise NotImplementedError(message)

    # Never reached (the constructor refuses); listed so the stub shows the whole interface it must fill.
    def transaction(self) -> contextlib.AbstractContextManager[OutboxTransaction]:
        raise NotImplementedError

    def fetch_batch(self, limit: int) -> OutboxBatch:
        raise NotImplementedError

    def mark_sent(self, ids: Sequence[int], *, now_ms: int) -> None:
        raise NotImplementedError

    def newest_id(self) -> int:
        raise NotImplementedError

    def pending_count(self) -> int:
        raise NotImplementedError

    def purge_sent(self, *, sent_before_ms: int) -> int:
        raise NotImplementedError

    @property
    def doorbell_path(self) -> str | None:
        raise NotImplementedError


def open_outbox(location: str, **options: Any) -> Outbox:
    """The outbox at ``location`` (``settings.outbox_db``): a ``postgresql://`` URL or a SQLite file path."""
    if location.startswith(("postgresql://", "postgres://")):
        return PostgresOutbox(location)
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

    Design. One relay per outbox (an flock next to the database refuses a second one: two relays would
    interleave). A round reads up to ``batch_size`` pending rows, sends them in id order through one
    idempotent producer (acks=all), waits for every acknowledgement and only then marks them sent. The
    Kafka key is the row's key (its aggregate), so order holds per aggregate, i.e. per partition; there
    is no order across partitions. A crash between the acks and the mark republishes at most that round:
    each message carries ``weir-outbox-id`` and ``weir-outbox-source`` headers for :class:`OutboxDedup`.
    A failed send restarts the producer and republishes the round from its first row (same bound).

    Waking. Same-process writers call :meth:`signal` (thread-safe). Other processes ring the doorbell,
    a Unix datagram socket: the relay then reads the newest id from the database and signals that. The
    relay waits on an asyncio event, not a poll; ``safety_timeout_s`` (default 30 s) re-checks the outbox
    only as a safety net, and is counted in ``stats.safety_wakes``.
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
        self.stats = RelayStats()
        self._on_published = on_published
        self._on_sleep = on_sleep
        # the environment's Kafka security options (WEIR_KAFKA_*), unless the caller's options say otherwise
        self._producer_options = {**kafka_client_options(), **(producer_options or {})}
        self._trigger = StreamTrigger()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._stop_requested = False
        self._producer: Any = None
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weir-outbox-db")
        self._doorbell_socket: socket.socket | None = None
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

    def _on_doorbell_readable(self) -> None:
        sock = self._doorbell_socket
        if sock is None:
            return
        rang = False
        while True:
            try:
                sock.recv(64)
            except (BlockingIOError, InterruptedError):
                break
            rang = True
        if rang:
            self._doorbell_dirty = True
            if self._doorbell_task is None:
                self._doorbell_task = asyncio.get_running_loop().create_task(self._answer_doorbell())

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
        unlock = self._lock()
        try:
            # The doorbell is bound before the first read: a ring that found no socket was rung before it.
            self._loop = loop
            path = self.outbox.doorbell_path
            if path is not None:
                self._doorbell_socket = Doorbell(path).listen()
                loop.add_reader(self._doorbell_socket.fileno(), self._on_doorbell_readable)
            log.info("outbox relay ready: outbox=%s topic=%s doorbell=%s batch=%d", self.outbox.source, self.topic, path, self.batch_size)
            await self._relay()
        finally:
            self._loop = None
            if self._doorbell_socket is not None:
                loop.remove_reader(self._doorbell_socket.fileno())
                self._doorbell_socket.close()
                self._doorbell_socket = None
            if self._doorbell_task is not None:
                self._doorbell_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._doorbell_task
            await self._close_producer()
            self._db.shutdown(wait=True)
            unlock()
            log.info("outbox relay stopped: %s", self.stats)

    def _lock(self) -> Callable[[], None]:
        """Take the outbox's relay lock (released by the kernel if this process dies); returns its release."""
        path = self.outbox.doorbell_path
        if path is None:
            return lambda: None
        handle = open(f"{path}.lock", "a+b")  # noqa: SIM115 - held for the whole run, closed by the release
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            message = f"outbox relay for {self.outbox.source}: another relay holds {path}.lock; one relay per outbox keeps the order"
            raise RuntimeError(message) from None
        return handle.close

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
        """Send ``rows`` in order and wait for every ack; retry the whole round on failure. False: stopped."""
        while True:
            try:
                producer = await self._ensure_producer()
                acks = []
                for row in rows:
                    headers = [*row.headers, (OUTBOX_ID_HEADER, str(row.id).encode()), (OUTBOX_SOURCE_HEADER, self.outbox.source.encode())]
                    acks.append(await producer.send(row.topic or self.topic, value=row.value, key=row.key, headers=headers))
                await asyncio.gather(*acks)
                return True
            except Exception:
                self.stats.publish_failures += 1
                log.exception("outbox %s: publishing rows %d..%d failed; retrying the round", self.outbox.source, rows[0].id, rows[-1].id)
                await self._close_producer()
                if self._stop_requested:
                    return False
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # a stop() cuts the backoff short
                    await asyncio.wait_for(self._wake.wait(), timeout=self.retry_backoff_s)
                if self._stop_requested:
                    return False

    async def _ensure_producer(self) -> Any:
        if self._producer is None:
            options: dict[str, Any] = {"linger_ms": self.linger_ms, **self._producer_options}
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all", **options)
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

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
