"""The commit, as one sequence (compare Quix Streams' ``Checkpoint.commit``): what weir does around Faust's commit.

Under exactly_once every commit runs these steps in this order; the functions below are the steps, top to bottom.

1. Close the commit gate and wait until no batch is in flight (:func:`force_commit`, as ``WeirConsumer.force_commit``):
   every event the transaction holds is then handled and acked before the offsets are chosen.
2. Faust chooses the offsets: its acked events, of which only handled ones count (``WeirConsumer.ack``), and no
   offset past a record nobody delivered (``WeirConsumer._new_offset``). It hands them to the transaction
   manager (``WeirTransactionManager.commit``), which runs :func:`commit_transactions`:
3. flush Faust's producer buffer: a table changelog write made outside a scope still waits there, and belongs to
   this transaction (writes made inside a scope were written out by it, :func:`app.engine.scopes.part_scope`);
4. await the deliveries the batches since the last commit left to it (:func:`app.engine.scopes.batch_scope`): a
   commit never covers an offset whose writes or sends failed;
5. per transaction (:func:`commit_one`): send the offsets to the transaction with the consumer group's
   metadata (KIP-447 fencing by generation, :mod:`app.engine.kip447`), commit it, begin the next one;
6. a fenced producer or a refused generation crashes the worker: another one owns the partitions now.
7. Faust records the committed offsets; each table's store records how far its changelog partitions are in it
   (:func:`persist_changelog_positions`: a rebalance then reads only what other workers wrote since); the gate opens
   again (:func:`force_commit`).

When a commit starts (at a pause, or every ``commit_interval`` under load) is ``WeirConsumer._commit_handler``'s
decision, spaced by :class:`CommitBudget`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

from aiokafka.errors import CommitFailedError, ProducerFenced
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP

from weir.app.engine.diagnostics import trace, tracing
from weir.app.engine.scopes import await_deliveries, gate, take_deferred

__all__ = [
    "force_commit",
    "commit_transactions",
    "persist_changelog_positions",
    "commit_one",
    "CommitBudget",
    "CommitObserver",
    "observe_commits",
    "AbortObserver",
    "observe_aborts",
]

log = logging.getLogger(__name__)

#: Told of every commit of :func:`commit_transactions`: (seconds it took, outcome), the outcome "committed",
#: "failed" (a delivery it covers failed, or it raised: nothing committed) or "fenced". For metrics: must not raise.
CommitObserver = Callable[[float, str], None]
_commit_observers: list[CommitObserver] = []


def observe_commits(observer: CommitObserver) -> None:
    """Tell ``observer`` of every exactly-once commit from now on (once, however often it is passed)."""
    if observer not in _commit_observers:
        _commit_observers.append(observer)


#: Told of every commit of :func:`commit_transactions` that did not commit: (its outcome, "failed" or "fenced";
#: the source partitions whose handled records it held). weir never commits such a transaction: the broker aborts
#: it (at the next producer of its transactional id, or at its timeout) and those records are handled again from
#: the committed offset. For metrics: must not raise.
AbortObserver = Callable[[str, Iterable[TP]], None]
_abort_observers: list[AbortObserver] = []


def observe_aborts(observer: AbortObserver) -> None:
    """Tell ``observer`` of every exactly-once commit that ended its transaction without committing it (once per observer)."""
    if observer not in _abort_observers:
        _abort_observers.append(observer)


async def force_commit(
    consumer: Any, faust_force_commit: Callable[[Any, bool], Awaitable[bool]], topics: Any, start_new_transaction: bool
) -> bool:
    """Steps 1 and 7: under exactly_once, the commit gate closes before Faust chooses the offsets to commit.

    Faust chooses them first (the acked events), then commits the transaction. The gate waits for the
    events still in flight, which finish inside the transaction: their outputs and changelog writes
    were committed, their offsets only by the next commit. A crash in between replayed them and sent
    their outputs a second time (``tests/integration/test_commit_boundary.py``). Once the gate is closed
    and idle, every event the transaction holds was acked before the offsets are chosen.
    """
    if not consumer.in_transaction:
        return await faust_force_commit(topics, start_new_transaction)
    async with gate.committing():
        return await faust_force_commit(topics, start_new_transaction)


async def commit_transactions(manager: Any, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
    """Steps 3 to 6, inside the commit gate (step 1): ``offsets`` are what Faust chose (step 2)."""
    began = time.monotonic()
    outcome = "failed"
    try:
        if gate.refused is not None:  # the worker stops with work in its transaction that must not commit
            log.warning("commit refused (%s)", gate.refused)
            return False
        # 3. Events delivered their own changelog writes (their part scope); a write made outside an event
        # would still wait in Faust's buffer, and belongs to this transaction.
        await manager.app.producer.buffer.flush()
        # 4. The batches handled since the last commit left their deliveries to it (batch_scope): a commit
        # never covers an offset whose writes or sends failed. Parts of an older consumer generation are
        # dropped (take_deferred).
        if not await await_deliveries(take_deferred(manager.app.consumer_generation_id)):
            return False
        # Every changelog write of the transaction is delivered: how far each changelog partition is in the store once
        # it commits (7.).
        written = dict(manager.app.tables._pending_persisted_offsets)
        # 5. One transaction per worker, or one per source partition, each on its own producer, side by side.
        by_transaction: dict[str, dict[TP, int]] = {}
        for tp, offset in offsets.items():
            by_transaction.setdefault(manager.transactional_id_for(tp.topic, tp.partition), {})[tp] = offset
        try:
            await asyncio.gather(
                *(commit_one(manager, txn_id, txn_offsets, start_new_transaction) for txn_id, txn_offsets in by_transaction.items())
            )
            outcome = "committed"
            persist_changelog_positions(manager.app.tables, written)
        except (ProducerFenced, CommitFailedError) as fenced:
            # 6. Another worker owns these partitions now (per partition: a producer with the same transactional
            # id; per worker: the group refused this member's generation): this one must not go on with stale state.
            outcome = "fenced"
            log.warning("producer fenced: %s", fenced)
            await manager.app.crash(fenced)
        return True
    finally:
        for observer in _commit_observers:
            observer(time.monotonic() - began, outcome)
        if outcome != "committed" and offsets:
            for abort_observer in _abort_observers:
                abort_observer(outcome, offsets.keys())
        if tracing():
            took = f"{1000 * (began - gate.commit_asked):.1f}+{1000 * (time.monotonic() - began):.1f}ms"
            trace(f"commit-gate+txn-{took}", TP("-", -1), len(offsets))


def persist_changelog_positions(tables: Any, written: Mapping[TP, tuple[Any, int]]) -> None:
    """Step 7 for the tables: record in each store how far its changelog partitions are in it, now that the transaction
    that wrote them committed (``written``: changelog partition -> (store, last offset written), Faust's
    ``persist_offset_on_commit`` books, taken once the transaction's deliveries were acknowledged).

    Faust meant to do this at each commit (``TableManager.on_commit``), but looks its books up by the committed *source*
    partitions, never the changelog partitions they are kept by: under exactly_once no position was ever recorded, and
    every rebalance read the changelog of every partition a worker kept from its beginning again, as a takeover does.
    The store is written before its changelog records are sent (:mod:`app.engine.overlay`), so it holds at least what
    the position says; a transaction that does not commit stops the worker, whose store is rebuilt at its restart
    (:func:`app.engine.restore.wipe_local_tables`).
    """
    pending = tables._pending_persisted_offsets
    for tp, (store, offset) in written.items():
        store.set_persisted_offset(tp, offset)
        if pending.get(tp) == (store, offset):
            del pending[tp]


async def commit_one(manager: Any, transactional_id: str, offsets: Mapping[TP, int], start_new_transaction: bool) -> None:
    """Step 5 for one transaction: its offsets with the group's metadata, its commit, and the next transaction begun."""
    # Faust's commit_transactions fails when a transaction is not open (a second commit during
    # shutdown, after one that did not start a new transaction): open one for the offsets then.
    producer = cast(aiokafka_driver.Producer, manager.producer)
    async with producer._trn_locks[transactional_id]:
        transaction_producer = producer._transaction_producers.get(transactional_id)
        if transaction_producer is None:
            log.warning("no transaction %s to commit %s in: they will be processed again", transactional_id, offsets)
            return
        if not transaction_producer._txn_manager.is_in_transaction():
            await transaction_producer.begin_transaction()
        # With one transaction per worker the producer sends TxnOffsetCommit v3 with the consumer's generation
        # and member id (kip447.attach_group_member): a member the group no longer knows is refused.
        await transaction_producer.send_offsets_to_transaction(offsets, manager.app.conf.id)
        await transaction_producer.commit_transaction()
        for tp, offset in offsets.items():
            trace("commit", tp, offset)
        if start_new_transaction:
            await transaction_producer.begin_transaction()


class CommitBudget:
    """When a commit started by a pause may follow the last one (``WeirConsumer._commit_handler``).

    At once while the commits of the last ``window_s`` took at most ``1 / (1 + spacing)`` of it (a light
    load); otherwise ``spacing`` times their average duration after it, so that commits take at most that
    share of the time under a moderate load. The average, not the last commit's duration: one slow commit
    (40 ms among commits of 2-3 ms) held the next one back by 80 ms, the tail of the barrier's release
    latency at 30 releases/s (p99 about 190 ms in most runs).
    """

    def __init__(self, spacing: float, window_s: float = 1.0) -> None:
        self.spacing = spacing
        self.window_s = window_s
        self._recent: collections.deque[tuple[float, float]] = collections.deque()  # (ended, duration)

    def next_commit_at(self, began: float, ended: float) -> float:
        recent = self._recent
        recent.append((ended, ended - began))
        while recent and recent[0][0] < ended - self.window_s:
            recent.popleft()
        spent = sum(duration for _, duration in recent)
        if spent <= self.window_s / (1 + self.spacing):
            return ended
        return ended + self.spacing * spent / len(recent)
