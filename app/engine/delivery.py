"""The consumer side of exactly-once: a delivery loop that never skips a record and never acks a stale one.

Faust's consumer (and its consumer thread) with weir's delivery loop, acks that count only events an agent
handled, a commit before every rebalance, and a commit handler that commits once the worker is idle; and the
checks an agent makes on each event it is delivered (:func:`to_process`, :func:`ack_handled_all`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Coroutine, Generator, Mapping
from typing import Any, cast

import faust.app.base
from aiokafka.structs import TopicPartition
from faust.transport.consumer import CONSUMER_FETCHING, ensure_TP, ensure_TPset
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP, EventT, Message
from faust.types.tuples import ack_lock
from faust.utils.functional import consecutive_numbers
from intervaltree import IntervalTree  # type: ignore[import-untyped]
from mode import Service, ServiceT
from mode.threads import WorkerThread
from mode.utils.futures import notify

from weir.app.engine import commit, offsets, restore
from weir.app.engine.config import installed, worker_slot
from weir.app.engine.diagnostics import trace, tracing
from weir.app.engine.fetcher import assigned_position, kafka_assignment, kafka_client, set_fetching, skipped_offsets, until_listed
from weir.app.engine.inbox import drop_revoked, inbox_for
from weir.app.engine.scopes import gate

__all__ = ["WeirConsumer", "WeirConsumerThread", "first_delivery", "to_process", "ack_handled_all"]

log = logging.getLogger(__name__)


class DaemonWorkerThread(WorkerThread):
    """The consumer's thread, as a daemon thread: a crashed worker's process exits.

    A worker that crashes (its producer fenced after a broker outage, say) stops its services; stopping the
    consumer's thread could fail ("Event loop is closed", the thread's stop scheduled on a loop already closed), and
    its loop then ran on. The interpreter waits for every non-daemon thread at exit, so the process never exited:
    nothing restarted it, and its partitions stayed with a group member that did nothing. Nothing is lost by not
    waiting for this thread at exit: what the worker did is committed in Kafka or not at all.
    """

    def __init__(self, service: Any, **kwargs: Any) -> None:
        super().__init__(service, **kwargs)
        self.daemon = True


class WeirConsumerThread(aiokafka_driver.AIOKafkaConsumerThread):
    """Faust's consumer thread, asking the broker for the end of a changelog before restoring it.

    Under exactly_once Faust took the "highwater" of a changelog from the last stable offset the
    consumer has *seen in a fetch*: unknown (-1) for a partition just taken over, so recovery read
    nothing and the new owner started from an empty table (completed groups completed again). A
    read_committed consumer's ``end_offsets`` is the last stable offset, from the broker.
    """

    Worker = DaemonWorkerThread

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        config = installed()
        if config.fetch_max_wait_ms is not None:
            # read by its fetcher, made when the consumer starts (Faust passes 1,500 and no way to change it)
            consumer._fetch_max_wait_ms = config.fetch_max_wait_ms
        static_member = config.static_member
        if static_member is not None:
            # Static membership (KIP-345): a worker restarted under its instance id within the session timeout
            # gets its partitions back without a rebalance of the group; it does not leave the group on a stop.
            consumer._group_instance_id = static_member or worker_slot(self.app.conf.web_port)
            log.info("static group membership: instance id %s", consumer._group_instance_id)
        return consumer

    #: seconds a worker waits, before it joins its group, for the broker to list every topic it subscribes to
    TOPICS_VISIBLE_WITHIN_S = 15.0

    async def subscribe(self, topics: Any) -> None:
        """Join only once the broker lists every subscribed topic (changelogs a worker creates as it starts).

        The group's leader assigns the partitions its metadata knows: a changelog topic created a moment
        before the join (by this worker or a peer) was missing from it, and the first assignment had no
        partition of it. A dynamic group mends that at its next rebalance; a static member restarted in
        place gets the stored assignment back without one, so a restarted worker owned no partition of
        its table, restored nothing and refused a payment commit for "no capture" (the 2,000-order chaos
        run with static members, 22 captures never committed).
        """
        topics = set(topics)
        await self.call_thread(self._until_listed, topics)  # the client belongs to the consumer thread's loop
        await super().subscribe(topics)

    async def _until_listed(self, topics: set[str]) -> None:
        client = self._ensure_consumer()._client
        missing = await until_listed(client, topics, self.TOPICS_VISIBLE_WITHIN_S)
        if missing:
            log.warning("joining without topics the broker does not list yet: %s", missing)

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        return await restore.changelog_ends(self._ensure_consumer(), partitions)

    async def earliest_offsets(self, *partitions: TP) -> Mapping[TP, int]:
        """The first offsets, not queued behind a fetch (:mod:`app.engine.offsets`); recovery asks them of every changelog."""
        return cast(Mapping[TP, int], await self.call_thread(offsets.beginning_offsets, self._ensure_consumer(), list(partitions)))


class WeirConsumer(aiokafka_driver.Consumer):
    """Faust's consumer with a delivery loop that never skips a record and never acks a stale one.

    Faust's loop (``Consumer._drain_messages``) hands records to the agents one by one from a batch
    fetched earlier. Three of its shortcuts commit offsets past records no agent handled:

    * a batch fetched before a seek or a rebalance is still delivered after it; every record of it
      moves the read offset forward, and the copies re-fetched from the sought position are then
      dropped as already read;
    * records of a partition paused meanwhile are dropped, though the fetch position is past them;
    * a stream skips an event of an older generation *and acks it*, so the offset of a record the new
      owner never handled lands among the acked ones; the commit then covers it. The head of the acked
      list may also miss the committed offset itself (Faust tolerates a one-offset hole there).

    Here every batch carries the *epoch* in which its fetch started; a seek, a rebalance or a flow stop
    moves the epoch, and the rest of a batch from an older epoch is thrown away after rewinding the
    fetch position of its partitions to the next offset not yet delivered (``_next``). Records of a
    partition that is not active are not delivered and that partition is rewound the same way. An
    offset missing between the committed or last delivered offset and the next record of a current
    batch is a gap the commit may cover only when a fetch stepped over it (a transaction marker, an
    aborted record: :class:`~app.engine.fetcher.SkippedOffsets`); any other hole is fetched again from the expected offset.
    Acks of an older generation are ignored: that record comes again from the committed offset. An
    event delivered twice in one generation (Faust's seeks) is processed once (:func:`first_delivery`).
    """

    _weir_epoch = 0

    def _new_consumer_thread(self) -> aiokafka_driver.AIOKafkaConsumerThread:
        return WeirConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def force_commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        """Under exactly_once, the commit gate closes before the offsets to commit are chosen (:mod:`app.engine.commit`)."""
        return await commit.force_commit(self, super().force_commit, topics, start_new_transaction)

    @property
    def _next(self) -> dict[TP, int]:
        """Per stream partition: the next offset to deliver (the sought or committed one, then the last delivered + 1)."""
        try:
            return cast(dict[TP, int], self.__dict__["_weir_next"])
        except KeyError:
            self.__dict__["_weir_next"] = {}
            return cast(dict[TP, int], self.__dict__["_weir_next"])

    def _moved(self) -> None:
        self._weir_epoch += 1

    def stop_flow(self) -> None:
        self._moved()
        super().stop_flow()

    def pause_partitions(self, tps: Any) -> None:
        tps = ensure_TPset(tps)
        super().pause_partitions(tps)
        self._fetch_changelogs(tps, fetch=False)

    def resume_partitions(self, tps: Any) -> None:
        tps = ensure_TPset(tps)
        super().resume_partitions(tps)
        self._fetch_changelogs(tps, fetch=True)

    def _fetch_changelogs(self, tps: set[TP], *, fetch: bool) -> None:
        """Pause (or resume) a table's changelog partitions in aiokafka's fetcher too, not only in Faust's books.

        Faust pauses a partition by leaving it out of the partitions it asks its client for; aiokafka's
        fetcher went on fetching every assigned partition. A changelog partition is read by recovery only,
        so its records, once fetched after recovery (the worker's own table writes), were never consumed:
        they sat in the fetcher's buffer, and while a partition's records wait there (up to aiokafka's
        100 ms prefetch backoff) the fetcher sends no fetch to that broker at all. With one broker that
        stalled every partition for 100 ms at each changelog partition's first write after an assignment
        (a light load's slowest orders). Stream partitions keep Faust's own flow control. A fetch already on
        its way when a partition is paused may still bring records of it: one such stall, not one per write.
        """
        wanted = [TopicPartition(tp.topic, tp.partition) for tp in tps if self._is_changelog_tp(tp)]
        client = kafka_client(self)
        if wanted and client is not None:
            # aiokafka's partition state belongs to the consumer thread's loop (a resume sets a future there)
            cast(Any, self)._thread.thread_loop.call_soon_threadsafe(set_fetching, client, wanted, fetch)

    async def seek(self, partition: TP, offset: int) -> None:
        self._moved()
        self._next[partition] = offset
        await super().seek(partition, offset)

    async def perform_seek(self) -> None:
        """Seek the partitions to their committed offsets, never below what this consumer committed itself.

        Faust seeks to the committed offsets again when recovery ends, and the group coordinator answers with the
        last *stable* offset: one this worker committed in a transaction a moment before is not stable until the
        transaction's marker reaches the offsets topic, so the answer may be the one before it. Taken as it came,
        that older offset became the consumer's committed offset: the worker's next commit moved the group's offset
        back below events it had processed and whose outputs were committed, and the next owner processed them again
        (duplicated outcomes in a chaos run, docs/exactly-once.md). What this consumer committed in its generation
        is the truth for its partitions: a lower answer is raised to it, the fetch position with it.
        """
        self._moved()
        committed = dict(await self.seek_to_committed())
        for tp, offset in list(committed.items()):
            known = self._committed_offset.get(ensure_TP(tp))
            if known is not None and (offset is None or offset < known):
                trace(f"committed-ahead-of-{offset}", ensure_TP(tp), known)
                await self._seek(ensure_TP(tp), known)
                committed[tp] = known
        positions = self._next
        acks_enabled_for = self.app.topics.acks_enabled_for
        # Changelog positions belong to recovery, which seeks them itself (a changelog has no committed offset: taken
        # as "from the beginning", a kept partition's next offset went to 0 after every restore, and two seconds later
        # the fetch-position watcher sought every changelog partition back to 0, "fetched up to N but delivered up to -1")
        changelogs = frozenset(self.app.tables.changelog_topics)
        for tp, offset in committed.items():
            if acks_enabled_for(tp.topic) and tp.topic not in changelogs:
                # no committed offset: the consumer starts from the beginning (auto_offset_reset="earliest")
                start = offset if offset is not None and offset >= 0 else 0
                positions[ensure_TP(tp)] = self._after_handled(ensure_TP(tp), start)
                trace(f"seek-from-{start}", ensure_TP(tp), positions[ensure_TP(tp)])
        self._read_offset.update({tp: offset if offset is not None and offset >= 0 else None for tp, offset in committed.items()})
        self._committed_offset.update({ensure_TP(tp): offset if offset else None for tp, offset in committed.items() if offset is not None})

    def _after_handled(self, tp: TP, start: int) -> int:
        """The first offset from ``start`` that was not handled in this generation (nor a gap between handled ones).

        Faust seeks the stream partitions to their committed offsets more than once in a generation (at the
        end of recovery, and whenever it fetches while the flow is stopped). An event handled since the last
        commit has its outputs and table writes in the open transaction, which commits with its offset:
        delivering it again sent its outputs twice (an invalid order's outcome twice in the all-stages crash
        loop). Handled offsets, acked and not committed yet (a rebalance clears them), are not delivered
        again; the first offset not handled is.
        """
        handled = set(self._acked.get(tp, ()))
        gaps: IntervalTree | None = self._gap.get(tp)
        position = start
        while position in handled or (gaps is not None and gaps.overlaps(position)):
            position += 1
        return position

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        self._moved()
        if revoked and self.in_transaction:
            await self._commit_before_rebalance()
        for tp in revoked:
            self._next.pop(tp, None)
        drop_revoked(revoked)
        await super().on_partitions_revoked(revoked)

    async def _commit_before_rebalance(self) -> None:
        """Under exactly_once, commit what was handled before a rebalance takes the partitions (as Kafka Streams does).

        Faust did not: the open transaction of a partition the worker keeps went on across the rebalance,
        the events it covered were read again from the committed offset, and Faust's recovery re-applied
        the changelog up to the last stable offset (it never records the persisted offset under
        exactly_once: ``persist_offset_on_commit`` is keyed by changelog partition, ``on_commit`` looks it
        up by source partition), reverting the table to its last committed values. The events then ran
        again on old state and sent their outputs a second time into the same transaction: two
        ``committed`` payment records for one order in the 2,000-order chaos run. Committing first leaves
        nothing handled and uncommitted: the changelog's stable offset covers every write, and the
        committed offsets every handled event. From here until the assignment, events are not processed
        (``CommitGate.hold``); the commit waits for the ones in flight (``CommitGate``).
        """
        self.stop_flow()
        self.app.flow_control.suspend()
        gate.hold()
        try:
            # commit() returns without committing when another commit is running (the timer's): that one
            # may not cover the last events handled, so wait for it, then commit for certain
            await self.maybe_wait_for_commit_to_finish()
            await self.force_commit()
        except Exception as error:
            # The handled events' table writes are in the local store, their transaction will not commit:
            # processing them again on top of that store would lose their outputs. A restarted worker
            # rebuilds its store from the committed changelog (wipe_local_tables).
            log.error("commit before a rebalance failed, stopping: %r", error)
            await self.app.crash(error)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        self._moved()
        try:
            await super().on_partitions_assigned(assigned, generation_id)
        finally:
            gate.release()  # the new generation is set: events of the old one are told apart by it

    def ack_part(self, messages: list[Message]) -> None:
        """Ack messages an agent handled (:func:`ack_handled_all`): the only acks that count toward a commit.

        Counted as Faust counts an ack (``Message.ack`` then ``Consumer.ack``), in one step for a part: once the
        last channel holding a message lets go of it (its reference count), unless of an older consumer
        generation (that record comes again from the committed offset) or below the committed offset.
        """
        generation = self.app.consumer_generation_id
        acks_enabled_for = self.app.topics.acks_enabled_for
        committed_offsets, acked_indexes, acked_lists = self._committed_offset, self._acked_index, self._acked
        unacked = self._unacked_messages
        counted = 0
        with ack_lock:
            for message in messages:
                if message.acked or message.decref():  # acked already, or another agent's channel still holds it
                    continue
                message.acked = True
                unacked.discard(message)
                if message.generation_id != generation or not acks_enabled_for(message.topic):
                    continue
                tp, offset = message.tp, message.offset
                committed = committed_offsets[tp]
                if committed is None or offset >= committed:
                    index = acked_indexes[tp]
                    if offset not in index:
                        index.add(offset)
                        acked_lists[tp].append(offset)
                        counted += 1
            self._n_acked += counted
        notify(self._waiting_for_ack)
        self._weir_uncommitted += len(messages)
        self._weir_work.set()

    _weir_uncommitted = 0
    #: when the delivery loop began waiting for records to process (None: records came since)
    _weir_waiting_since: float | None = None

    @property
    def _weir_work(self) -> asyncio.Event:
        """Set when an event was handled since the commit handler last looked (it sleeps on it while idle)."""
        if "_weir_work_event" not in self.__dict__:
            self.__dict__["_weir_work_event"] = asyncio.Event()
        return cast(asyncio.Event, self.__dict__["_weir_work_event"])

    def _weir_fetch_idle_for(self) -> float:
        """Seconds the delivery loop has been waiting for records that do not come (0 while records keep coming).

        A pause of the gate is a reason to commit only when no records are coming either. Under a backlog the
        gate pauses between every two batches, and committing at each pause made the commits, not the work,
        most of a busy pipeline's cost: every commit is four requests, and a marker in every partition its
        transaction touched; the broker spent more CPU on them than the workers on the orders, and the
        backlog rate halved. Under a backlog the consumer thread has fetched ahead, and the next records are
        handed over at once; a worker that is caught up waits for them. Changelog records (a standby's
        restore) do not count: they keep coming while the worker's own input is quiet.
        """
        since = self._weir_waiting_since
        return 0.0 if since is None else time.monotonic() - since

    @Service.task
    async def _commit_handler(self) -> None:
        """Commit as soon as the worker is idle, and at least every ``commit_interval`` while it is busy.

        A fixed interval makes every hop of a pipeline wait half an interval on average for its
        transaction to commit (a read_committed reader sees nothing before). Here a worker that has
        handled events commits once no event has been in flight, and no record has come to be processed,
        for ``commit_idle_s`` (:meth:`_weir_fetch_idle_for`): under a light load each batch commits right
        away; under a steady load or a backlog records keep coming and commits come every
        ``commit_interval``, as in Faust. ``commit_idle_s`` = 0: Faust's fixed timer.
        The handler sleeps on events (work handled, the gate going idle), not on a polling timer: a
        commit starts ``commit_idle_s`` after the last batch ended, not up to half of it later.

        A commit holds every batch back while it runs (a few broker round trips, per source partition
        under ``per_partition``).
        Under a moderate load the gate is idle often, and committing at each pause spent most of the time
        committing: a worker offered 150 orders/s fell behind. So once commits took more than a third of
        the last second, a commit started by a pause comes at least ``commit_spacing`` times their
        average duration after the last one (:class:`~app.engine.commit.CommitBudget`), and a hop's latency stays a few commit
        durations. Under a light load commits are not spaced: a slow commit (20-30 ms now and then) made
        the next one wait twice as long, the tail of the light-load latency.
        """
        interval = self.commit_interval
        config = installed()  # EngineConfig.commit_idle_s and commit_spacing
        idle_s = config.commit_idle_s
        await self.sleep(interval)
        if not idle_s:
            async for _ in self.itertimer(interval, name="commit"):
                await self.commit()
            return
        work = self._weir_work
        budget = commit.CommitBudget(config.commit_spacing)
        last = spare_at = time.monotonic()
        while not self.should_stop:
            now = time.monotonic()
            if not self._weir_uncommitted:
                work.clear()
                await self.wait_for_stopped(work, timeout=interval)  # type: ignore[arg-type]  # mode waits on any .wait()
                if not self._weir_uncommitted:
                    last = time.monotonic()
                continue
            gate_idle = gate.idle_for()
            idle = min(gate_idle, self._weir_fetch_idle_for())  # no event in flight, and none coming
            if now - last >= interval or (idle >= idle_s and now >= spare_at):
                self._weir_uncommitted = 0
                began = time.monotonic()
                await self.commit()
                last = time.monotonic()
                spare_at = budget.next_commit_at(began, last)
            elif gate_idle > 0:
                wake_at = min(max(now + idle_s - idle, spare_at), last + interval)
                await asyncio.sleep(max(0.0, wake_at - now))
            else:
                await self.wait_for_stopped(gate.idle_event, timeout=max(0.0, interval - (now - last)))  # type: ignore[arg-type]

    def ack(self, message: Message) -> bool:
        # Never counted: an event an agent handled is acked by ack_part. What comes here is a stream acking the
        # events it skips (an older generation, or flow control off during a rebalance) as if done, or an agent
        # leaving an event out (to_process); counted, the commit would cover records no agent processed. They
        # come again from the committed offset after the rebalance's seek.
        with ack_lock:
            message.acked = True
            self._unacked_messages.discard(message)
        return False

    def _new_offset(self, tp: TP) -> int | None:
        acked = self._acked[tp]
        if not acked:
            return None
        max_offset = max(acked)
        gaps: IntervalTree = self._gap[tp]
        if gaps:
            covered = sorted(gaps.overlap(0, max_offset + 1), key=lambda interval: interval.begin)
            filled = [offset for interval in covered for offset in range(interval.begin, interval.end)]
            if filled:
                gaps.chop(0, max(filled[-1], max_offset) + 1)
                index = self._acked_index[tp]
                for offset in filled:
                    if offset not in index:
                        index.add(offset)
                        acked.append(offset)
        acked.sort()
        committed = self._committed_offset[tp]
        if committed is not None:
            while acked and acked[0] < committed:  # committed already
                self._acked_index[tp].discard(acked.pop(0))
            if not acked or acked[0] != committed:
                return None  # the record at the committed offset is not done yet
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return int(batch[-1]) + 1

    async def _rewind(self, firsts: Mapping[TP, int]) -> None:
        """Seek the partitions of an abandoned batch back to the next offset not yet delivered.

        ``firsts`` holds each partition's first offset in the batch: the fetch position before it, for a
        partition with nothing delivered or sought since. Always right: a seek since the batch was fetched
        set the offset to its target, and a batch fetched after such a seek has moved the fetch position
        past records now thrown away (a table's changelog being restored too: recovery must see them).
        """
        assigned = self.assignment()
        for tp, first in firsts.items():
            target = self._next.get(tp, first)
            if tp not in assigned:
                continue  # revoked meanwhile: its owner starts from the committed offset
            try:
                await self._seek(tp, target)
            except Exception as exc:
                log.info("rewind of %s to %s skipped: %r", tp, target, exc)

    #: seconds a fetch position may stay ahead of the next offset to deliver before the partition is rewound
    STUCK_AFTER_S = 2.0

    async def _watch_fetch_positions(self) -> None:
        """Rewind a partition whose fetch position stays ahead of what was delivered, with no batch in hand.

        Between batches every fetched record has been delivered, so a fetch position past the next offset
        to deliver means records were consumed from the client and dropped (seen around a takeover: the
        records after the last delivered one never came again). Offsets the fetcher stepped over itself
        (:class:`~app.engine.fetcher.SkippedOffsets`: transaction markers, aborted records) are not such a gap.
        """
        now = time.monotonic()
        if now - self.__dict__.get("_weir_watched", 0.0) < self.STUCK_AFTER_S / 2:
            return
        self.__dict__["_weir_watched"] = now
        watch: dict[TP, tuple[int, int, float]] = self.__dict__.setdefault("_weir_watch", {})
        assignment = kafka_assignment(self)
        if assignment is None:
            return
        acks_enabled_for = self.app.topics.acks_enabled_for
        for tp, next_offset in list(self._next.items()):
            position = assigned_position(assignment, tp) if acks_enabled_for(tp.topic) else None
            if position is None or position <= next_offset or skipped_offsets.covers(tp.topic, tp.partition, next_offset, position):
                # nothing ahead, or only what the fetcher stepped over itself: transaction markers and aborted
                # records at the end of the partition (a rewind would only step over them again, and kept a
                # changelog's recovery from seeing its position reach the end: Faust looks every 5 s)
                watch.pop(tp, None)
                continue
            seen = watch.get(tp)
            if seen is None or seen[:2] != (next_offset, position):
                watch[tp] = (next_offset, position, now)
            elif now - seen[2] >= self.STUCK_AFTER_S:
                if position - next_offset > 1:
                    log.info("%s: fetched up to %s but delivered up to %s; fetching again", tp, position - 1, next_offset - 1)
                watch.pop(tp, None)
                await self._rewind({tp: next_offset})

    async def _deliver(self, delivery: Any) -> bool:
        """Run the conductor's callback for one record; False if the flow stopped before it was delivered.

        Faust races every record's delivery against ``suspend_flow`` with ``wait_first``: four tasks made
        and cancelled per record, a tenth of a busy worker's time. The callback almost never waits (it
        puts the event in a queue with room), so it is first run here up to its first suspension; only a
        callback that does wait (flow control, a full queue, the producer's buffer) goes on as a task
        raced against ``suspend_flow``, as in Faust.
        """
        try:
            pending = delivery.send(None)
        except StopIteration:
            return True
        task = asyncio.ensure_future(_go_on(delivery, pending))
        outcome = await self.wait_first(task, self.suspend_flow.wait())
        if task in outcome.done:
            return True
        task.cancel()
        return False

    async def _drain_messages(self, fetcher: ServiceT) -> None:
        callback = self.callback
        consumer_stopped = cast(Service, self)._stopped.is_set
        fetcher_stopped = cast(Service, fetcher)._stopped.is_set
        positions = self._next
        committed_offsets = self._committed_offset
        acks_enabled_for = self.app.topics.acks_enabled_for
        # Table changelogs are read by recovery, which seeks them itself (from the persisted offset, past a
        # compacted start): their holes are not checked against the stream's committed offsets.
        changelogs = frozenset(self.app.tables.changelog_topics)
        commit_every = self._commit_every
        since_yield = 0
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                self.diag.set_flag(CONSUMER_FETCHING)
                await self._watch_fetch_positions()
                epoch = self._weir_epoch
                if self._weir_waiting_since is None:
                    self._weir_waiting_since = time.monotonic()
                records, active = await self._wait_next_records(1.0)
                await self.sleep(0)
                if not records or self.should_stop:
                    continue
                if any(tp.topic not in changelogs for tp in records):
                    self._weir_waiting_since = None  # records to process came: not idle (_weir_fetch_idle_for)
                generation = self.app.consumer_generation_id
                firsts = {tp: batch[0].offset for tp, batch in records.items() if batch}
                for tp in firsts:  # the end offsets of the partitions fetched, for Faust's lag sensors
                    self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                if tracing():
                    for tp, first in firsts.items():
                        trace("fetched", tp, first)
                inactive: set[TP] = set()
                for tp, record in self.scheduler.iterate(records):
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    if epoch != self._weir_epoch or not self.flow_active or generation != self.app.consumer_generation_id:
                        await self._rewind(firsts)
                        break
                    if tp in inactive:
                        continue
                    if active is not None and tp not in active and tp not in self._buffered_partitions:
                        inactive.add(tp)
                        await self._rewind({tp: record.offset})
                        continue
                    offset = record.offset
                    expected = positions.get(tp)
                    if expected is not None and offset < expected:
                        continue  # delivered before
                    if acks_enabled_for(tp.topic) and tp.topic not in changelogs:
                        expected = expected if expected is not None else committed_offsets.get(tp)
                        if expected is not None and offset > expected:
                            if not skipped_offsets.covers(tp.topic, tp.partition, expected, offset):
                                # No fetch stepped over these offsets (markers, aborted records): the fetch
                                # position moved past records nobody delivered. Fetch this partition again
                                # from the expected offset; the batch goes on with the others.
                                log.warning("%s: offsets %s..%s were skipped by a fetch; fetched again", tp, expected, offset - 1)
                                trace(f"refetch-to-{offset}", tp, expected)
                                positions[tp] = expected
                                inactive.add(tp)
                                await self._rewind({tp: expected})
                                continue
                            trace(f"gap-to-{offset}", tp, expected)
                            self._gap[tp].addi(expected, offset)
                    if commit_every is not None and self._n_acked >= commit_every:
                        self._n_acked = 0
                        await self.commit()
                    before = positions.get(tp)
                    inbox = inbox_for(tp.topic)
                    if inbox is not None:  # straight to the agent's batch (app.engine.inbox)
                        if inbox.full() and not await self._deliver(inbox.wait_space()):
                            firsts[tp] = offset
                            await self._rewind(firsts)  # not delivered: the flow stopped
                            break
                        inbox.put(self._to_message(tp, record))
                    elif not await self._deliver(callback(self._to_message(tp, record))):
                        firsts[tp] = offset
                        await self._rewind(firsts)  # not delivered: the flow stopped
                        break
                    if positions.get(tp) == before:  # unless a seek moved it meanwhile
                        positions[tp] = offset + 1
                    if epoch != self._weir_epoch:
                        # delivered while a seek or a rebalance happened: the stream skips it (older
                        # generation) or it comes again from the sought position
                        await self._rewind(firsts)
                        break
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


@types.coroutine
def _resume(coroutine: Coroutine[Any, Any, Any], pending: Any) -> Generator[Any, Any, Any]:
    """Go on with a coroutine that was run by hand up to its first suspension on ``pending`` (``yield from``'s protocol)."""
    value = pending
    try:
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:
                value = coroutine.throw(error)
            else:
                value = coroutine.send(sent)
    except StopIteration as stop:
        return stop.value


async def _go_on(coroutine: Coroutine[Any, Any, Any], pending: Any) -> Any:
    return await _resume(coroutine, pending)


#: Per stream partition: the consumer generation, and the offsets this worker's agents processed in it (not committed yet).
_processed: dict[TP, tuple[int | None, set[int]]] = {}


def commit_before_stop() -> None:
    """Patch 19: a worker that stops (SIGTERM, or any orderly stop) commits what it handled and holds the gate before
    Faust's stop revokes its tables, as before a rebalance (:meth:`WeirConsumer._commit_before_rebalance`).

    Faust's stop (``App._stop_consumer``) revokes the tables, stops the flow and then waits until every delivered
    event is acked, committing as it goes. The agents went on with the events already in their inboxes meanwhile:
    their outputs were sent into the open transaction, and the final commit of the stop carried them; but their
    table writes came after the revocation and their offsets were chosen before they were acked, so a worker
    started after a SIGTERM read them again and sent their outputs a second time (a fifth of the orders done at the
    stop, in ``tests/integration/test_worker_exit.py``). Committed and held first, nothing handled is left out of
    a commit, and the events still waiting are acked without being processed: the next owner reads them from the
    committed offset.

    Patch: ``faust.app.base.App._stop_consumer`` is wrapped (Faust's private name).
    """
    app_class: Any = faust.app.base.App
    original = app_class._stop_consumer
    if getattr(original, "weir_commit_before_stop", False):
        return

    async def _stop_consumer(self: Any) -> None:
        consumer = self._consumer
        if isinstance(consumer, WeirConsumer) and consumer.in_transaction:
            try:
                assigned = consumer.assignment()
            except Exception:  # not started: nothing handled
                assigned = set()
            if assigned:
                await consumer._commit_before_rebalance()
        await original(self)

    _stop_consumer.weir_commit_before_stop = True  # type: ignore[attr-defined]
    app_class._stop_consumer = _stop_consumer


def first_delivery(event: EventT[Any]) -> bool:
    """Whether this event's offset is new to this worker's agents in the current consumer generation.

    Faust seeks the stream partitions to their committed offsets when recovery ends, after it has let the
    flow resume: an event processed (or buffered for an agent) just before that seek is delivered again
    from the committed offset. Both copies were processed, in the same transaction: an order priced twice
    in the flow crash test. A copy is acked and left out; the first processing is in the open transaction,
    which commits with the first copy's ack. Offsets below the committed one are forgotten: a seek never
    goes below it. A set, not a high-water mark: it makes no assumption on the order in which an agent
    takes a partition's events. Called inside the commit gate.
    """
    message = event.message
    tp, offset = message.tp, message.offset
    seen = _processed.get(tp)
    if seen is None or seen[0] != message.generation_id:
        seen = _processed[tp] = (message.generation_id, set())
    offsets = seen[1]
    if offset in offsets:
        trace("again", tp, offset)
        return False
    offsets.add(offset)
    if len(offsets) > 4096:
        committed = cast(Any, event.app.consumer)._committed_offset.get(tp)
        if committed is not None:
            offsets.difference_update([old for old in offsets if old < committed])
    return True


def forget_delivery(event: EventT[Any]) -> None:
    """An event taken for processing (:func:`to_process`) and not begun: its slice's time was up
    (:func:`app.core.run_sliced`). It comes again in the next slice, in the same generation, and must be processed
    then, not left out as a copy (:func:`first_delivery`)."""
    message = event.message
    seen = _processed.get(message.tp)
    if seen is not None and seen[0] == message.generation_id:
        seen[1].discard(message.offset)


def to_process(event: EventT[Any]) -> bool:
    """Whether an agent should process this event now; if not, it is acked (an ack that never counts toward a commit).

    Not now: during a rebalance (:meth:`~app.engine.scopes.CommitGate.hold`) or of an older consumer generation, the partition's
    owner reads it again from the committed offset; or a copy delivered again by a seek (:func:`first_delivery`).
    Called inside the commit gate.
    """
    if gate.holding or event.message.generation_id != event.app.consumer_generation_id or not first_delivery(event):
        event.ack()
        return False
    return True


def ack_handled_all(events: list[EventT[Any]]) -> None:
    """Ack the events of a part its agent processed, in one step (:meth:`WeirConsumer.ack_part`): the only kind of
    ack a commit counts (see :class:`WeirConsumer`)."""
    if not events:
        return
    consumer = events[0].app.consumer
    if isinstance(consumer, WeirConsumer):
        consumer.ack_part([event.message for event in events])
    else:
        for event in events:
            event.ack()
