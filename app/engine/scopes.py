"""The commit gate and the scopes events are processed in: a commit falls between batches, never inside one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from faust.streams import _current_event
from faust.types import EventT
from faust.types.tuples import FutureMessage

from weir.app.engine.config import installed
from weir.app.engine.overlay import _scope_changelog, _scope_sends, _scope_writes, send_changelogs, write_out_tables
from weir.app.engine.produce import Outbox, flush, scope_outbox

__all__ = ["CommitGate", "gate", "BatchScope", "batch_scope", "part_scope", "await_deliveries", "take_deferred"]

log = logging.getLogger(__name__)


class CommitGate:
    """Commits happen between events, never in the middle of one.

    Faust commits on a timer while agents keep processing. Under exactly_once that splits an event's
    effects across two transactions: the changelog write of a table update in one, the result it sent
    in the next; a crash between them commits half of the event (a completed group whose result is
    never sent, or an offset committed without its state). Every event is processed, its changelog
    writes made and its offset acked inside :meth:`processing` (their delivery is awaited there or by
    the commit, :func:`batch_scope`); a commit waits in
    :meth:`committing` until no event is in flight and holds new ones back until it is done.
    """

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._idle_since = time.monotonic()
        self._open = asyncio.Event()
        self._open.set()
        self._held = False
        #: When the running (or last) commit asked for the gate.
        self.commit_asked = 0.0
        #: Why this worker commits nothing more (:meth:`refuse`); None while it may commit.
        self.refused: str | None = None

    def hold(self) -> None:
        """A rebalance began: until :meth:`release` (the new generation is set) events are not processed.

        Between the revocation and the assignment the consumer generation does not change yet, so an
        event delivered before the flow stopped still looks current: processed then, its table writes
        would reach the local store in a transaction the rebalance may end. Such events are acked
        without being processed (:attr:`holding`; an ack of an unprocessed event never counts toward a
        commit) and come again from the committed offset. They are not kept waiting: Faust's revocation
        waits until every delivered event is acked (a held batch deadlocked the rebalance).
        """
        self._held = True

    def release(self) -> None:
        self._held = False

    def refuse(self, reason: str) -> None:
        """From now on no commit of this worker commits anything (:func:`app.engine.commit.commit_transactions`).

        For a worker that stops because its open transaction holds work that must not commit: the sends of a
        part that failed half-way (its offsets not acked, its table writes dropped), or table writes whose
        changelog records were not all sent. Faust's stop commits what is acked (``Consumer.on_stop``), and that
        transaction would carry them: outputs without their input's offset, sent again when the input is
        replayed. Refused, the transaction is aborted as a SIGKILL's would be (the next instance's producer
        fences it, or the broker's timeout ends it), and everything since the last commit is handled again.
        """
        if self.refused is None:
            log.warning("no further commit: %s", reason)
            self.refused = reason

    @property
    def holding(self) -> bool:
        """Whether a rebalance is between its revocation and its assignment (see :meth:`hold`)."""
        return self._held

    @contextlib.asynccontextmanager
    async def processing(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._active += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()
                self._idle_since = time.monotonic()

    @property
    def idle_event(self) -> asyncio.Event:
        """Set while no event or batch is being processed."""
        return self._idle

    def idle_for(self) -> float:
        """Seconds since the last event or batch finished, 0 while one is being processed."""
        return 0.0 if self._active else time.monotonic() - self._idle_since

    def describe(self) -> str:
        """The gate's state for a diagnostic: events or batches in flight, and whether it is open."""
        return f"active={self._active} open={self._open.is_set()}"

    @contextlib.asynccontextmanager
    async def committing(self) -> AsyncIterator[None]:
        self.commit_asked = time.monotonic()  # the trace line of the commit counts its wait here from it
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(asyncio.shield(self._idle.wait()), timeout=10.0)
            except TimeoutError:
                log.warning("commit waits for %d event(s) still being processed", self._active)
                await self._idle.wait()
            yield
        finally:
            self._open.set()


gate = CommitGate()


#: The parts handled since the last commit whose deliveries nobody awaited yet (``EngineConfig.defer_deliveries``).
_deferred: list[tuple[EventT[bytes], list[FutureMessage]]] = []


def take_deferred(generation: int) -> list[tuple[EventT[bytes], list[FutureMessage]]]:
    """The deferred parts of consumer generation ``generation``, for the commit to await; every deferred part is forgotten.

    Parts of an older consumer generation are dropped: their transactions ended with the rebalance (their
    producers were replaced), and their events come again from the committed offset.
    """
    parts = [part for part in _deferred if part[0].message.generation_id == generation]
    _deferred.clear()
    return parts


class BatchScope:
    """The parts of one batch handled inside :func:`batch_scope`, with what each of them sent."""

    def __init__(self) -> None:
        self.handled: list[tuple[EventT[bytes], list[FutureMessage]]] = []
        #: The handled parts' records sent with ``send_record``, queued as record batches when the batch ends.
        self.outboxes: list[Outbox] = []

    @contextlib.asynccontextmanager
    async def part(self, event: EventT[bytes]) -> AsyncIterator[None]:
        """One partition's part (``event`` is its last) or one event, in :func:`part_scope`; at its end its tables'
        writes are written out and their changelog records sent (:func:`app.engine.overlay.send_changelogs`).
        What it sent with ``send_record`` is noted, and queued when the batch ends (:meth:`flush`) under exactly_once,
        when the part ends under at_least_once; a part that raises sends none of it."""
        pending: list[FutureMessage] = []
        records: list[Any] = []
        box = Outbox(event, pending) if _producer_ready(getattr(event, "app", None)) else None
        with part_scope(event, pending, records, box):
            try:
                yield
                write_out_tables()
                send_changelogs(records)
            except BaseException as error:
                if records:
                    await _store_ahead_of_changelog(event, error)
                raise
        if box is not None and box.records:
            if event.app.in_transaction:
                self.outboxes.append(box)
            else:
                # Under at_least_once a commit does not wait for the batch (it is not gated): it flushes the producer
                # and commits what is acked. This part is acked once it returns, so its records are queued now; left
                # for the batch's end, a commit in between committed its offsets without them (a SIGKILL then lost them).
                await flush([box])
        self.handled.append((event, pending))

    async def flush(self) -> None:
        """Queue what the handled parts sent with ``send_record`` (:func:`app.engine.produce.flush`).

        A send refused here (the producer closed or fenced, its transaction ended by a rebalance) is treated as an
        undelivered send of the batch's last part: the parts are acked, so their transaction must not commit. When
        a part's changelog records were among them, the store is ahead of its changelog: the worker stops, as when a
        part fails with records not sent (:func:`_store_ahead_of_changelog`).
        """
        outboxes, self.outboxes = self.outboxes, []
        if not outboxes:
            return
        changelogs = [box.event for box in outboxes if any(noted[5] is not None for noted in box.records)]
        try:
            await flush(outboxes)
        except Exception as error:  # every refusal ends the same way
            if changelogs:  # their writes are in the local store already
                await _store_ahead_of_changelog(changelogs[-1], error)
            else:
                await _undelivered(outboxes[-1].event, error)


def _producer_ready(app: Any) -> bool:
    """Whether sends can be queued as record batches: a transaction, or a started producer (not a unit test's stand-in app)."""
    producer = getattr(app, "producer", None)
    return bool(getattr(app, "in_transaction", False) or getattr(producer, "started", False))


async def _store_ahead_of_changelog(event: EventT[bytes], error: BaseException) -> None:
    """A part failed with table writes in the local store whose changelog records were not all sent: stop the worker.

    The store's writes of a part go before its records are sent (:meth:`~app.engine.overlay.WeirTable._write_out_direct`);
    a send refused, a write-out that raised halfway, the part cancelled meanwhile, or the part's body raising after a
    table was written out early (an iteration) leaves the store holding values the changelog will not. Events
    handled next on that store would commit what no restore can rebuild, so the worker stops; it restarts on a
    store rebuilt from the committed changelog (``wipe_local_tables``), and commits nothing more before it stops
    (:meth:`CommitGate.refuse`). A worker stopping anyway (its agents cancelled) just goes on stopping, committing
    nothing more either: its store is rebuilt at the next start too.
    """
    app = event.app
    message = (
        f"table writes of {event.message.tp}@{event.message.offset} are in the local store but not in the changelog ({error!r}): stopping"
    )
    gate.refuse(message)
    if isinstance(error, asyncio.CancelledError) and app.should_stop:
        return
    log.error(message)
    await app.crash(RuntimeError(message))


@contextlib.asynccontextmanager
async def batch_scope() -> AsyncIterator[BatchScope]:
    """Handle a batch between commits: its parts (``scope.part(event)``), then all their deliveries awaited at once.

    Under exactly_once (``EngineConfig.defer_deliveries``) the deliveries are awaited by the next commit instead,
    before its transactions commit (:func:`app.engine.commit.commit_transactions`): the batch's sends and the
    offsets it acked commit together or not at all, so the batch need not wait for the broker's acks. The
    worker goes on with the next batch while they are in flight, instead of one round trip (two, with the
    transaction's AddPartitionsToTxn) per batch.
    """
    async with gate.processing():
        scope = BatchScope()
        try:
            yield scope
        finally:
            await scope.flush()  # the parts handled before an error are acked: their sends go with them
        if installed().defer_deliveries:
            _deferred.extend(part for part in scope.handled if part[1])
        else:
            await await_deliveries(scope.handled)


@contextlib.contextmanager
def part_scope(
    event: EventT[bytes], pending: list[FutureMessage], records: list[Any] | None = None, outbox: Outbox | None = None
) -> Iterator[None]:
    """One event, or one partition's part of a batch (``event`` is its last): the unit of table writes and sends.

    Faust's current event is ``event`` (tables read and write its partition, sends join its partition's
    transaction); table writes are written once per key at the end; changelog writes and sends are added
    to ``pending``, which :func:`batch_scope` awaits (:func:`await_deliveries`) before it leaves the commit
    gate. When the body raises, its pending table writes are dropped: the event was not handled, and its
    redelivery starts from the state before it. ``records``: a RocksDB table's writes leave their changelog
    records there, for the scope to send (:meth:`BatchScope.part`); None: Faust's own changelog sends.
    ``outbox``: ``send_record`` notes its records there (:mod:`app.engine.produce`); None: it sends each at once.
    """
    outbox_token = scope_outbox.set(outbox)
    sends_token = _scope_sends.set(pending)
    writes_token = _scope_writes.set({})
    changelog_token = _scope_changelog.set(records)
    event_token = _current_event.set(weakref.ref(event))
    try:
        yield
        write_out_tables()
    finally:
        _current_event.reset(event_token)
        _scope_changelog.reset(changelog_token)
        _scope_writes.reset(writes_token)
        _scope_sends.reset(sends_token)
        scope_outbox.reset(outbox_token)


async def await_deliveries(parts: list[tuple[EventT[bytes], list[FutureMessage]]]) -> bool:
    """Wait until every part's changelog writes and sends are delivered; crash the worker when one was not (False)."""
    futures = [future for _, pending in parts for future in pending]
    if not futures:
        return True
    timeout_s = installed().delivery_timeout_s
    await asyncio.wait(futures, timeout=timeout_s)
    for event, pending in parts:
        undelivered = [future for future in pending if not future.done()]
        failed = [future for future in pending if future.done() and future.exception() is not None]
        if undelivered or failed:
            await _undelivered(event, failed[0].exception() if failed else TimeoutError(f"not delivered in {timeout_s}s"))
            return False
    return True


async def _undelivered(event: EventT[bytes], problem: BaseException | None) -> None:
    tp = event.message.tp
    app = event.app
    if event.message.generation_id != app.consumer_generation_id or tp not in app.consumer.assignment():
        # A rebalance meanwhile (eager: every partition is revoked, and its producer replaced): the
        # transaction died with its producer, the acks of this generation do not count, and the partition's
        # owner reads it again from the committed offset.
        log.info("writes and sends of %s@%s dropped: a rebalance ended their transaction", tp, event.message.offset)
        return
    message = f"writes or sends of {tp}@{event.message.offset} failed ({problem}): stopping, the transaction must not commit"
    gate.refuse(message)
    await app.crash(RuntimeError(message))


#: Per stream partition: the consumer generation, and the offsets this worker's agents processed in it (not committed yet).
