"""The batch loop every agent of a worker runs (:func:`handle_parts`), inside the engine's exactly-once scopes.

The worker itself (its settings, Faust application, topics and tables) is :class:`app.application.Application`;
what a stage's code shares with the test driver is in :mod:`app.shell` (re-exported here). Importing this module
builds nothing and reads no environment variable."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from faust.types import EventT, StreamT

from weir.app import engine, metrics
from weir.app.shell import (
    DecodeError,
    EventHandler,
    OwedOutcome,
    SliceClock,
    all_at_once,
    dead_letter_key,
    dead_letter_value,
    dead_lettered,
    decode_event,
    handle_part_events,
    message_headers,
    now_ms,
    partitions_of,
    record_limit,
    redact_dead_letters,
    send_dead_letter,
    send_dead_letter_record,
    slice_clock,
)
from weir.app.split import InvalidMessage

__all__ = [
    "handle_parts",
    "refuse_out_of_order_agents",
    "run_parts",
    "Slicer",
    # re-exported from app.shell
    "now_ms",
    "message_headers",
    "decode_event",
    "EventHandler",
    "OwedOutcome",
    "handle_part_events",
    "dead_lettered",
    "all_at_once",
    "record_limit",
    "partitions_of",
    "dead_letter_key",
    "redact_dead_letters",
    "send_dead_letter_record",
    "dead_letter_value",
    "send_dead_letter",
    "InvalidMessage",
    "DecodeError",
]

log = logging.getLogger(__name__)


def refuse_out_of_order_agents(agents: Iterable[Any]) -> None:
    """Under exactly_once, stop a worker whose agent runs several actors (Faust's ``concurrency`` above 1).

    Such an agent takes a partition's events out of order, and no commit can then cover exactly the events
    whose outputs it carries (see :func:`run_parts`). An agent that waits on I/O runs its batch's events at
    once instead (:func:`handle_parts` and :func:`handle_part_events` with ``concurrent=True``). Under
    at_least_once a replay is allowed.
    """
    for agent in agents:
        if getattr(agent, "concurrency", 1) > 1:
            message = (
                f"agent {agent.name!r} runs {agent.concurrency} actors (concurrency={agent.concurrency}) under exactly_once: "
                "they would take a partition's events out of order, and a commit could carry outputs of events whose offsets "
                "it does not commit; use concurrency=1, and handle_parts(..., concurrent=True) with "
                "handle_part_events(..., concurrent=True) to run a batch's events at once"
            )
            raise RuntimeError(message)


PartHandler = Callable[[Sequence[EventT[bytes]]], Awaitable[None]]


async def handle_parts(
    stream: StreamT[bytes],
    handle_part: PartHandler,
    *,
    size: int,
    wait_ms: int,
    crash: Callable[[BaseException], Awaitable[None]],
    concurrent: bool = False,
    bounded: bool = False,
) -> None:
    """Take events in batches (:func:`take_batches`: up to ``size``, what is ready) and run them (:func:`run_sliced`,
    ``bounded``: a stage that runs the user's steps); an error that escapes stops the worker (``crash``)."""
    slicer = Slicer(size)
    async with worker_stops_on_escape(crash):
        async for batch in take_batches(stream, size, wait_ms / 1000):
            await run_sliced(batch, handle_part, slicer, concurrent=concurrent, bounded=bounded)


@contextlib.asynccontextmanager
async def worker_stops_on_escape(crash: Callable[[BaseException], Awaitable[None]]) -> AsyncIterator[None]:
    """An error that escapes an agent's loop stops the worker (it is not bad input: that is dead-lettered).

    Only a refused output (:class:`app.errors.OutputFailed`) or a bug in weir escapes. Faust's supervisor would
    restart the agent's actor, and the batch it held would be neither handled nor delivered again while the
    worker runs: the partitions' committed offsets would stop below it for good, while the events after it
    committed their outputs (sent again after the next restart). A restarted worker reads the batch again
    from the committed offset, on tables rebuilt from the changelog.
    """
    try:
        yield
    except Exception as error:
        # The failed part's sends are in the open transaction without its offsets: nothing may commit now.
        engine.gate.refuse(f"an error escaped an agent's loop: {error!r}")
        log.error("an error escaped an agent's loop, the worker stops: %r", error)
        await crash(error)
        raise


#: How long one slice of a batch may run before a commit due may go: well under the transaction timeout.
SLICE_BUDGET_S = 1.0


class Slicer:
    """How many events of a batch go in one :func:`run_parts` call: as many as run in about ``budget_s``.

    A batch runs between two commits, so under exactly_once inside one transaction: a batch of 500 orders
    whose item steps take 100 ms each would keep it open 50 s, past the transaction timeout (the broker
    aborts it and fences the worker, which then crash-loops on the same batch). Slices start at
    ``first`` events and follow the last slice's time per event, between 1 and ``most``, growing at most twofold
    from one slice to the next. The first slice is one event: a worker that starts on a backlog of heavy events
    (bundles of 50 item messages whose steps take 2.5 s each) would otherwise take 50 of them in its first
    transaction, past the timeout; a fast stream still reaches ``most`` within ten slices.

    Only events that ran count: events skipped without running (of an older consumer generation, or taken
    while a rebalance holds the gate) take no time, and counting them once sized the next slice at 500 orders
    of 110 ms each, 55 s in one transaction: the inline splitter that took over a killed worker's partitions
    was fenced and crashed.
    """

    def __init__(self, most: int, *, first: int = 1, budget_s: float | None = None) -> None:
        self.most = max(1, most)
        self.size = min(self.most, first)
        self.budget_s = SLICE_BUDGET_S if budget_s is None else budget_s

    def took(self, events: int, seconds: float) -> None:
        """``events`` ran in ``seconds``: the next slice is as many as fit the budget at that pace (at most twice
        this one). A slice in which no event ran says nothing about the pace and changes nothing."""
        if events <= 0:
            return
        fits = int(events * self.budget_s / seconds) if seconds > 0 else self.most
        self.size = max(1, min(self.most, fits, 2 * max(self.size, events)))


async def run_sliced(
    events: Sequence[EventT[bytes]], handle_part: PartHandler, slicer: Slicer, *, concurrent: bool = False, bounded: bool = False
) -> None:
    """Run a batch with :func:`run_parts`, in slices (:class:`Slicer`), letting a commit that is due go between them.

    The slices follow the batch's delivery order, so each partition's handled (acked) events are still a
    prefix of what it delivered when a commit comes between two slices: the commit covers them, and the
    events of later slices, not yet acked, are left for the next one.

    ``bounded`` (a stage that runs the user's steps, whose time can jump at any event): a slice also stops beginning
    events once its budget has passed (:class:`app.shell.SliceClock`), and the events it did not begin go first in
    the next slice. Such a stage used to run slices of one event, a transaction each: the barrier's arrivals took
    twice the CPU (``bench.barrier``).
    """
    rest = list(events)
    while rest:
        piece, rest = rest[: slicer.size], rest[slicer.size :]
        began = time.monotonic()
        ran, left = await _run_parts(piece, handle_part, concurrent=concurrent, until=began + slicer.budget_s if bounded else None)
        slicer.took(ran, time.monotonic() - began)
        rest = left + rest
        if rest:
            await asyncio.sleep(0)  # the commit handler, woken by the idle gate, may close it now


def take_batches(stream: StreamT[bytes], max_: int, within: float) -> AsyncIterator[list[EventT[bytes]]]:
    """An agent's batches: up to ``max_`` events, each handed on as soon as no further event is ready. Events are
    not acked here: the caller acks them inside their exactly-once scope. With ``WEIR_DIRECT_BATCHES`` (the
    default) they come from the agent's inbox, straight from the consumer's delivery loop; else from Faust's
    stream (``within`` bounds how long it sleeps between looks): :func:`app.engine.streams.batches`.
    """
    return engine.batches(stream, max_, within)


async def run_parts(events: Sequence[EventT[bytes]], handle_part: PartHandler, *, concurrent: bool = False) -> int:
    """Hand a batch to ``handle_part`` by source partition, each partition's part inside one exactly-once scope;
    return how many events ran (the others were skipped: see below).

    No commit can start while a batch is handled. While a partition's part is handled Faust's current event
    is the part's last event (tables use that partition's store and changelog, sends join the transaction
    that commits that partition's offsets: the worker's one, or the partition's own under per_partition)
    and each table key is written once (``engine.part_scope``). Every event of the batch is acked before the
    batch leaves the commit gate, and every send and changelog write of it is delivered before a commit
    covers it (by the batch under at_least_once, by the next commit under exactly_once:
    ``engine.batch_scope``), so the commit that covers one of its offsets covers all of them and all they wrote
    and sent. Events of an older consumer generation are acked without processing, as Faust's own stream
    does: the partition's new owner gets them again from the committed offset. ``concurrent``: the parts
    are handled at once, each in a task of its own (its own part scope).

    A partition's events are handled in offset order, in one batch at a time: when a commit closes the gate,
    every event this agent took is either handled and acked or not begun, and the acked offsets of each
    partition are a prefix of what was delivered. That is why an agent must run one actor (Faust's
    ``concurrency=1``, :func:`refuse_out_of_order_agents`): several actors take one partition's events out
    of order, and a commit would carry the outputs of handled events above one still waiting at the gate
    while committing the offsets only below it; a crash then replays them.
    """
    ran, _ = await _run_parts(events, handle_part, concurrent=concurrent)
    return ran


async def _run_parts(
    events: Sequence[EventT[bytes]], handle_part: PartHandler, *, concurrent: bool, until: float | None = None
) -> tuple[int, list[EventT[bytes]]]:
    """:func:`run_parts`; ``until`` (a monotonic instant; not with ``concurrent``): no event begins after it, once one
    ran (:class:`app.shell.SliceClock`). Returns how many events ran, and the events left, in delivery order per
    partition: taken for processing, not begun, forgotten as delivered (:func:`app.engine.forget_delivery`) and neither
    acked nor handled, for the caller to run next."""
    clock = SliceClock(until) if until is not None and not concurrent else None
    left: list[EventT[bytes]] = []
    ran_parts: dict[Any, list[EventT[bytes]]] = {}
    began = time.monotonic()
    async with engine.batch_scope() as scope:
        entered = time.monotonic()
        # Inside the commit gate: no commit runs meanwhile, and a rebalance that began is seen (engine.to_process).
        parts: dict[Any, list[EventT[bytes]]] = {}
        for event in events:
            engine.trace("event", event.message.tp, event.message.offset)
            if engine.to_process(event):
                parts.setdefault(event.message.tp, []).append(event)

        async def run(part: list[EventT[bytes]]) -> None:
            if clock is not None:
                if clock.up():  # the slice's time is up before this part began
                    left.extend(part)
                    return
                clock.handled = None
            token = slice_clock.set(clock)  # None: the part runs whole
            try:
                async with scope.part(part[-1]):
                    await handle_part(part)
            finally:
                slice_clock.reset(token)
            handled = len(part)
            if clock is not None:
                if clock.handled is None:  # a handler that takes its part whole
                    clock.begun += handled
                else:
                    handled = clock.handled
                    left.extend(part[handled:])
            engine.ack_handled_all(part[:handled])
            if handled:
                ran_parts[part[0].message.tp] = part[:handled]

        if concurrent and len(parts) > 1:
            await all_at_once(run(part) for part in parts.values())
        else:
            for part in parts.values():
                await run(part)
    for event in left:
        engine.forget_delivery(event)
    metrics.batch_handled(ran_parts)
    if events and engine.tracing():  # the batch's size, its wait at the gate and its time inside
        took = f"{1000 * (entered - began):.1f}-{1000 * (time.monotonic() - entered):.1f}ms"
        engine.trace(f"batch-{len(events)}-{took}", events[-1].message.tp, events[-1].message.offset)
    return sum(len(part) for part in ran_parts.values()), left
