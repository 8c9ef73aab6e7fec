"""Split/aggregate, the Faust shell shared by the foundation pipeline and a flow's ``split``/``aggregate`` steps.

* :func:`split_messages`: what a split sends: the items in chunks of ``chunk`` to the items topic, and the
  group's ``open`` (correlation id, total, deadline, context) to the aggregate topic. When every item fits
  in one chunk the open rides in that chunk instead and comes back with its outcomes: one record less to
  send and one less for the aggregate stage to read, in the common case.
* :func:`send_splits`: sends them for a batch's groups at once, in bundles (:func:`send_bundled`).
* :class:`ItemWorker`: runs the item step on each item of a chunk (with retries), dead-letters a failed
  item alone, and sends the chunk's outcomes to the aggregate topic in one message (a batch's, bundled).
* :class:`Aggregation`: merges outcomes by correlation id into a table (``tables.aggregates``), completes
  a group by count, last-flag or timeout (a deadline index walked by ticks), and hands the result and
  the open's context to ``emit``.

The agents that use them (``agents/splitter.py``, ``agents/items.py``, ``agents/aggregator.py``,
``agents/flows.py``) own the topics and tables; nothing here declares an agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

import faust
from faust.types import EventT, TableT

from weir.app import metrics
from weir.app.codec import dumps
from weir.app.deadlines import DeadlineIndex
from weir.app.errors import RetryPolicy, StepOutcome, run_with_retry
from weir.app.kafka_io import key_partition
from weir.app.runtime import environment
from weir.app.runtime.keyed import (
    Change,
    KeyedState,
    Output,
    Refusal,
    Undeliverable,
    dead_letter_output,
    drop_undeliverable,
    prepare_outputs,
    send_checked,
)
from weir.app.shell import (
    InvalidMessage,
    all_at_once,
    dead_letter_value,
    dead_lettered,
    handle_part_events,
    now_ms,
    partitions_of,
    record_limit,
    send_dead_letter,
)
from weir.tables.aggregates import (
    BATCH_END,
    DEAD_LETTERED,
    FORCE_ACTIONS,
    NEW_GROUP,
    TOO_LARGE,
    AggregatorConfig,
    DoneState,
    GroupState,
    GroupTransition,
    ItemOutcome,
    Part,
    complete_now,
    force_message,
    inline_result,
    on_expire,
    on_force,
    on_items,
    on_late_item,
    on_new_group,
    on_open,
    on_part,
)

log = logging.getLogger(__name__)

__all__ = [
    "split_messages",
    "send_split",
    "send_splits",
    "send_bundled",
    "bundle_messages",
    "parse_items",
    "ItemWorker",
    "aggregate_inline",
    "Aggregation",
    "GroupStore",
    "ResultOutputs",
    "dead_lettered_result",
    "outline_of",
    "invalid_result",
    "send_result",
    "force_message",
]


def split_messages(
    correlation_id: str,
    items: list[Any],
    *,
    chunk: int,
    deadline_ms: int | None,
    context: Any = None,
    headers: dict[str, str] | None = None,
    origin: str | None = None,
    payloads_in_open: bool = False,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The ``open`` of a group and its item messages: consecutive items, ``chunk`` per message (each carries its indexes).

    One chunk: no separate open (None); the chunk carries it as ``open`` (deadline, context), the item stage
    hands it on with the outcomes, and the aggregate opens the group and merges them in one step. Such a
    group has no deadline before its outcomes arrive: the timeout waits for items that are missing, and the
    outcomes of a single chunk arrive together or, if the chunk itself is dead-lettered, not at all (the
    dead letter holds the chunk with its open, to be sent again).

    ``origin``: the input the group is split from (its record, or its execution), on the open and on every chunk: the
    aggregate tells a redelivery (the same origin) from another input that reuses the group's id. ``payloads_in_open``:
    the open carries every item's payload (``items``), so that the aggregate can ask for a missing one again.
    """
    total = len(items)
    size = max(1, chunk)
    opened: dict[str, Any] = {"kind": "open", "correlation_id": correlation_id, "total": total, "deadline_ms": deadline_ms}
    if context is not None:
        opened["context"] = context
    if origin is not None:
        opened["origin"] = origin
    if payloads_in_open:
        opened["items"] = list(items)
    chunks: list[dict[str, Any]] = []
    for first in range(0, total, size):
        message: dict[str, Any] = {
            "correlation_id": correlation_id,
            "total": total,
            "items": [
                {"index": index, "last": index == total - 1, "payload": items[index]} for index in range(first, min(first + size, total))
            ],
        }
        if headers:
            message["headers"] = headers
        if origin is not None:
            message["origin"] = origin
        chunks.append(message)
    if len(chunks) == 1:
        chunks[0]["open"] = {key: value for key, value in opened.items() if key in ("deadline_ms", "context")}
        return None, chunks
    return opened, chunks


async def send_split(
    correlation_id: str, opened: dict[str, Any] | None, chunks: list[dict[str, Any]], *, results: faust.TopicT, items: faust.TopicT
) -> None:
    """Send what :func:`split_messages` made for one group, a record per message (:func:`send_splits`)."""
    await send_splits([encode_split(correlation_id, opened, chunks)], results=results, items=items, size=1)


def encode_split(correlation_id: str, opened: dict[str, Any] | None, chunks: list[dict[str, Any]]) -> tuple[list[Keyed], list[Keyed]]:
    """What :func:`split_messages` made, keyed and encoded: the open (if apart), and the chunks keyed ``id#first index``.

    Raises :class:`InvalidMessage` when one is larger than a record may be (:func:`encoded`), so that the
    order is dead-lettered alone, not the batch it came in.
    """
    opens = [] if opened is None else [(correlation_id, encoded(opened, what=f"the open of {correlation_id!r}"))]
    keyed = [
        (f"{correlation_id}#{chunk['items'][0]['index']}", encoded(chunk, what=f"an item message of {correlation_id!r}"))
        for chunk in chunks
    ]
    return opens, keyed


async def send_splits(splits: Sequence[tuple[list[Keyed], list[Keyed]]], *, results: faust.TopicT, items: faust.TopicT, size: int) -> None:
    """Send the opens (to ``results``) and the chunks (to ``items``) of several groups (:func:`encode_split`), bundled.

    ``size``: messages per record at most (:func:`send_bundled`; 1: a record each). Every chunk still goes to
    the partition its own key picks, so a batch's chunks go out in one record per items partition.
    """
    await send_bundled(results, [opened for opens, _ in splits for opened in opens], size=size)
    await send_bundled(items, [chunk for _, chunks in splits for chunk in chunks], size=size)


def parse_items(raw: Any) -> list[tuple[str, int, int | None, bool, Any]]:
    """The items of an item message: one item (``index``, ``payload``) or a chunk (``items``: a list of them)."""
    if not isinstance(raw, dict):
        message = f"items: an item message must be a JSON object, got {type(raw).__name__}"
        raise InvalidMessage(message)
    chunk = raw.get("items")
    if chunk is None:
        return [_parse_one(raw, raw, None)]
    if not isinstance(chunk, list) or not chunk:
        message = f"items: field 'items' must be a non-empty list, got {type(chunk).__name__}"
        raise InvalidMessage(message)
    return [_parse_one(raw, item, number) for number, item in enumerate(chunk)]


def _place(number: int | None) -> str:
    """Where an item is in its message, for a problem's message (formatted only when there is one)."""
    return "" if number is None else f"items[{number}] "


def _parse_one(envelope: dict[str, Any], item: Any, number: int | None) -> tuple[str, int, int | None, bool, Any]:
    """One item of a message (``number``: its place in the message's ``items``; None: the message is the item)."""
    if not isinstance(item, dict):
        message = f"items: {_place(number)}must be a JSON object, got {type(item).__name__}"
        raise InvalidMessage(message)
    correlation_id = envelope.get("correlation_id")
    index = item.get("index")
    total = envelope.get("total")
    if not isinstance(correlation_id, str) or not correlation_id:
        message = f"items: field 'correlation_id' must be a non-empty string, got {correlation_id!r}"
        raise InvalidMessage(message)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        message = f"items: {_place(number)}item of {correlation_id!r} field 'index' must be a non-negative integer, got {index!r}"
        raise InvalidMessage(message)
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total <= index):
        where = _place(number)
        message = f"items: {where}item {index} of {correlation_id!r} field 'total' must be an integer above the index, got {total!r}"
        raise InvalidMessage(message)
    return correlation_id, index, total, bool(item.get("last", False)), item.get("payload")


#: Runs the item step on one item: (payload, its index, the item message) -> its outcome, retried already.
ItemStep = Callable[[Any, int, dict[str, Any]], Awaitable[StepOutcome]]


class ItemWorker:
    """The per-item stage: ``handle_part(events)`` runs ``step`` on every item of each item message."""

    def __init__(
        self,
        *,
        agent: str,
        step: ItemStep,
        results: faust.TopicT,
        concurrent: bool,
        concurrency: int,
        bundle: int = 1,
        in_place: Callable[[Any], Any] | None = None,
        policy: RetryPolicy | None = None,
        blocking_s: float | None = None,
        stop_on_failure: bool = False,
    ) -> None:
        self.agent = agent
        #: a message's items run one after the other stop at the first that fails (Camel's sequential
        #: ``stopOnException``): the later ones are not run; their outcomes say so (items run at once all run)
        self.stop_on_failure = stop_on_failure
        #: the retries of ``in_place`` after its first attempt failed (``step`` retries itself)
        self.policy = policy if policy is not None else RetryPolicy()
        self.step = step
        #: ``step``'s plain sync function, tried in place before ``step`` (which then retries from the second
        #: attempt): three coroutines per item fewer, a twentieth of an inline splitter's time
        self.in_place = None if concurrent else in_place
        self.results = results
        #: outcome messages per record at most (:func:`send_bundled`, by :meth:`handle_part`)
        self.bundle = bundle
        #: run the items of a message at once (an async step may wait on I/O), up to ``concurrency`` per worker
        self.concurrent = concurrent
        self._running = asyncio.Semaphore(max(1, concurrency))
        #: ``in_place`` runs until two calls of it in a row take longer than this; then ``step`` (a thread pool's, a
        #: message's items at once) runs every item from the next one on: a step that blocks neither serialises an
        #: order's items nor holds the event loop, a short one keeps the in-place call's low cost (None: never switch).
        #: Two, not one: a call of microseconds measured 21-108 ms once in a while (a garbage collection, or the
        #: process descheduled on a busy machine), and one such call moved a short step to the pool for the worker's
        #: life, where it cost twice the CPU per order at half the rate (bench/changes.md).
        self.blocking_s = blocking_s if in_place is not None and not concurrent else None
        #: whether the last in-place call took longer than ``blocking_s``
        self._blocked_last = False

    def _to_the_pool(self, took_s: float) -> None:
        log.info(
            "%s: the item step took %.0f ms in the event loop, the second call in a row over %.0f ms: from now on it "
            "runs in its thread pool, a message's items at once",
            self.agent,
            took_s * 1000,
            (self.blocking_s or 0) * 1000,
        )
        self.in_place = None
        self.concurrent = True

    async def _run(self, payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
        async with self._running if self.concurrent else contextlib.nullcontext():
            return await self.step(payload, index, message)

    async def handle_part(self, part: Sequence[EventT[bytes]], *, what: str) -> None:
        """A partition's part of a batch: every item message's outcomes, bundled by the results partition they go to.

        An event holds an item message or a ``bundle`` of them (:func:`send_splits`); each item message is
        handled alone (a bad one dead-lettered alone, the dead letter holding that message). Their outcome
        messages then go out :func:`send_bundled`, so the aggregate stage reads one record per destination
        partition instead of one per item message.
        """
        outgoing: list[Keyed] = []

        async def collect_one(event: EventT[bytes], raw: Any) -> None:
            outgoing.append(await self.encoded_outcomes(event, raw))

        async def collect(event: EventT[bytes], raw: Any) -> None:
            if is_bundle(raw):
                await each_bundled(event, raw, agent=self.agent, handle=collect_one, concurrent=self.concurrent)
            else:
                await collect_one(event, raw)

        await handle_part_events(part, agent=self.agent, what=what, handler=collect, concurrent=self.concurrent)
        await send_bundled(self.results, outgoing, size=self.bundle)

    async def encoded_outcomes(self, event: EventT[bytes], raw: Any) -> Keyed:
        """The outcome message of an item message, encoded; one too large for a record becomes failed outcomes.

        The aggregate still hears of every item (failed: "result too large", with the size and sha256), and
        the results themselves go to the dead letters, cut to fit.
        """
        key, message = await self.outcomes(event, raw)
        output = Output(self.results, key, message, what="the item outcomes")
        prepared = prepare_outputs([output], record_limit())
        if not prepared.undeliverable:
            return key, prepared.ready[0][1]
        [failure] = prepared.undeliverable
        await dead_letter_output(event, failure, agent=self.agent, step="outcomes")
        error = f"result too large to send: {failure.problem} (sha256 {failure.sha256 or '-'}; in the dead letters)"
        reported = message["items"] if message["kind"] == "items" else [message]
        failed = [{**item, "ok": False, "result": None, "error": error[:500]} if item.get("ok") else item for item in reported]
        message = {**message, "items": failed} if message["kind"] == "items" else {**message, **failed[0]}
        return key, encoded(message, what=f"{self.agent}: the outcomes of an item message of {key!r}")

    async def run_items(self, event: EventT[bytes], message: dict[str, Any], items: Sequence[tuple[int, bool, Any]]) -> list[StepOutcome]:
        """The item step's outcome on each (index, last, payload) of item message ``message``; each failed item dead-lettered.

        ``message`` holds at least the group's ``correlation_id`` and ``total`` (a flow's step reads its headers too).
        The items run at once (an async step), or one after the other in place (a plain sync step, retried
        through ``step`` from its second attempt only when it raised), or one after the other through ``step``.
        """
        correlation_id, total = message["correlation_id"], message.get("total")
        if self.concurrent:
            outcomes = list(await asyncio.gather(*(self._run(payload, index, message) for index, _, payload in items)))
        elif self.in_place is not None:
            outcomes = []
            # read once per message, not per item (the loop runs once per item of every order)
            clock, blocking_s, stop_on_failure = time.perf_counter, self.blocking_s, self.stop_on_failure
            for position, (_, _, payload) in enumerate(items):
                if stop_on_failure and outcomes and not outcomes[-1].ok:
                    outcomes += self._not_run(items[position:], outcomes[-1], items[position - 1][0])
                    break
                in_place = self.in_place
                if in_place is None:  # it blocked on an earlier item of this message: the rest at once, in the pool
                    rest = items[position:]
                    outcomes += await asyncio.gather(*(self._run(later, index, message) for index, _, later in rest))
                    break
                started = clock()
                try:
                    outcome = StepOutcome(True, in_place(payload), None, 1)
                    took_s = clock() - started  # the call alone: a retry's backoff is not the step blocking
                except Exception as error:  # a user step may raise anything: the retry policy decides what follows
                    took_s = clock() - started
                    outcome = await run_with_retry(self.policy, functools.partial(in_place, payload), failed=error)
                outcomes.append(outcome)
                if blocking_s is not None:
                    blocked = took_s > blocking_s
                    if blocked and self._blocked_last:
                        self._to_the_pool(took_s)
                    self._blocked_last = blocked
        else:
            outcomes = []
            for position, (index, _, payload) in enumerate(items):
                if self.stop_on_failure and outcomes and not outcomes[-1].ok:
                    outcomes += self._not_run(items[position:], outcomes[-1], items[position - 1][0])
                    break
                outcomes.append(await self._run(payload, index, message))
        for (index, last, payload), outcome in zip(items, outcomes, strict=True):
            if not outcome.ok and outcome.attempts > 0:  # an item not run (stop_on_failure) is no failure of its own
                error_text = f"item {index} of {correlation_id!r} failed after {outcome.attempts} attempts: {outcome.error}"
                # The dead letter holds the failed item alone, as a one-item message: it can be sent back to the items topic.
                single = {"correlation_id": correlation_id, "index": index, "total": total, "last": last, "payload": payload}
                await send_dead_letter(
                    event,
                    reason="failed",
                    error=error_text,
                    agent=self.agent,
                    step="process",
                    attempts=outcome.attempts,
                    value=dumps(single),
                )
        return outcomes

    @staticmethod
    def _not_run(rest: Sequence[tuple[int, bool, Any]], failed: StepOutcome, failed_index: int) -> list[StepOutcome]:
        """The outcomes of the items after a failed one that stops the message: failed, not run (0 attempts)."""
        error = f"not run: item {failed_index} failed before it ({(failed.error or '')[:200]})"
        return [StepOutcome(ok=False, value=None, error=error, attempts=0) for _ in rest]

    async def outcomes(self, event: EventT[bytes], raw: Any) -> tuple[str, dict[str, Any]]:
        """The key and the outcome message of an item message (a failed item is dead-lettered here)."""
        parsed = parse_items(raw)
        correlation_id, total = parsed[0][0], parsed[0][2]
        outcomes = await self.run_items(event, raw, [(index, last, payload) for _, index, _, last, payload in parsed])
        results = []
        for (_, index, _, last, _), outcome in zip(parsed, outcomes, strict=True):
            results.append(
                {
                    "index": index,
                    "last": last,
                    "ok": outcome.ok,
                    "result": outcome.value,
                    "error": outcome.error,
                    "attempts": outcome.attempts,
                }
            )
        if len(results) == 1:
            message = {"kind": "item", "correlation_id": correlation_id, "total": total, **results[0]}
        else:
            message = {"kind": "items", "correlation_id": correlation_id, "total": total, "items": results}
        if isinstance(raw.get("open"), dict):
            message["open"] = raw["open"]  # the group's open, folded into its only chunk (split_messages)
        if isinstance(raw.get("origin"), str):
            message["origin"] = raw["origin"]  # the input the group was split from: the aggregate checks it
        return correlation_id, message


async def aggregate_inline(
    worker: ItemWorker, config: AggregatorConfig, event: EventT[bytes], correlation_id: str, items: list[Any]
) -> dict[str, Any]:
    """A group split, its items run and its result made in one step: Camel's splitter with an aggregation strategy.

    ``worker`` runs the item step on every item (retried; a failed item is dead-lettered alone, as the items
    stage does) and :func:`tables.aggregates.inline_result` makes the result the aggregate stage would emit
    for those outcomes. Nothing is stored: under exactly_once the result is sent in the transaction that
    commits the input's offset, so a crash before the commit sends it again, and one after never does.
    """
    now = now_ms()
    deadline_ms = config.deadline_from(now)
    total = len(items)
    message = {"correlation_id": correlation_id, "total": total}
    outcomes = await worker.run_items(event, message, [(index, index == total - 1, payload) for index, payload in enumerate(items)])
    return inline_result(config, correlation_id, [(outcome.ok, outcome.value, outcome.error) for outcome in outcomes], deadline_ms, now)


#: A message ready to send: its key and its encoded value.
Keyed = tuple[str, bytes]

_BUNDLE_HEAD, _BUNDLE_TAIL = b'{"kind":"bundle","messages":[', b"]}"


def encoded(message: Any, *, what: str) -> bytes:
    """``message`` as JSON, or :class:`InvalidMessage` when it is larger than one record may be (:func:`record_limit`)."""
    value = dumps(message)
    if len(value) > record_limit():
        raise InvalidMessage(f"{what} is {len(value)} bytes, more than a record may hold ({record_limit()})")
    return value


def bundle_messages(bundle: dict[str, Any], *, agent: str) -> list[Any]:
    """The messages a ``bundle`` holds (:func:`send_bundled`), or :class:`InvalidMessage`."""
    messages = bundle.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidMessage(f"{agent}: a bundle needs a non-empty list 'messages', got {messages!r:.200}")
    return messages


def is_bundle(message: Any) -> bool:
    return isinstance(message, dict) and message.get("kind") == "bundle"


async def each_bundled(
    event: EventT[bytes],
    bundle: dict[str, Any],
    *,
    agent: str,
    handle: Callable[[EventT[bytes], Any], Awaitable[None]],
    concurrent: bool = False,
) -> None:
    """``handle(event, message)`` for each message of a ``bundle``, alone: a bad one is dead-lettered alone.

    Its dead letter holds that message, not the bundle. ``concurrent``: all at once (a step that waits on
    I/O), else in order.
    """

    async def one(message: Any) -> None:
        with dead_letter_value(message):
            await dead_lettered(event, agent=agent, run=functools.partial(handle, event, message))

    messages = bundle_messages(bundle, agent=agent)
    if concurrent:
        await all_at_once(one(message) for message in messages)
    else:
        for message in messages:
            await one(message)


async def send_bundled(topic: faust.TopicT, outgoing: Sequence[Keyed], *, size: int) -> None:
    """Send keyed messages, up to ``size`` per record: a ``bundle`` of those that go to one partition.

    A message's key decides its partition (the aggregate stage's tables are partitioned by it), so a bundle
    holds only messages whose keys go to one partition, is sent to that partition, and is keyed by its first
    message's key. A bundle stays within :func:`record_limit` bytes. A partition with one message, ``size``
    1, or a topic whose partition count is unknown (:func:`app.core.partitions_of`) gets plain messages.
    """
    partitions = partitions_of(topic.get_topic_name())
    if len(outgoing) < 2 or size < 2 or not partitions:
        for key, value in outgoing:
            await environment.send_record(topic, key.encode(), value)
        return
    by_partition: dict[int, list[Keyed]] = {}
    for key, value in outgoing:
        by_partition.setdefault(key_partition(key.encode(), partitions), []).append((key, value))
    room = record_limit() - len(_BUNDLE_HEAD) - len(_BUNDLE_TAIL)
    for partition, messages in by_partition.items():
        piece: list[Keyed] = []
        used = 0
        for key, value in messages:
            if piece and (len(piece) >= size or used + len(value) + 1 > room):
                await _send_piece(topic, partition, piece)
                piece, used = [], 0
            piece.append((key, value))
            used += len(value) + 1
        await _send_piece(topic, partition, piece)


async def _send_piece(topic: faust.TopicT, partition: int, piece: list[Keyed]) -> None:
    key = piece[0][0].encode()
    if len(piece) == 1:
        await environment.send_record(topic, key, piece[0][1])
    else:
        await environment.send_record(topic, key, _BUNDLE_HEAD + b",".join(value for _, value in piece) + _BUNDLE_TAIL, partition=partition)


#: The outputs that hand a completed group's result on: (event, correlation id, result, the open's context) -> outputs.
ResultOutputs = Callable[[EventT[bytes], str, dict[str, Any], Any], Sequence[Output]]

#: A key's state in the aggregate stage: an open group, a completed one (remembered to count late items), or nothing.
AggregateState = GroupState | DoneState


class GroupStore:
    """The aggregate stage's :class:`app.runtime.keyed.Store`: open groups in one table, completed ones in another."""

    def __init__(self, open_groups: TableT[str, Any], done_groups: TableT[str, Any]) -> None:
        self.open_groups = open_groups
        self.done_groups = done_groups

    def load(self, key: str) -> AggregateState | None:
        done = self.done_groups.get(key)
        if done is not None:
            return DoneState.from_dict(done)
        raw = self.open_groups.get(key)
        return None if raw is None else GroupState.from_dict(raw)

    def encoded_size(self, key: str, state: AggregateState) -> int:
        return len(dumps(state.to_dict())) + len(key.encode())

    def save(self, key: str, previous: AggregateState | None, state: AggregateState | None) -> None:
        if isinstance(previous, GroupState) and not isinstance(state, GroupState):
            del self.open_groups[key]
        if isinstance(previous, DoneState) and not isinstance(state, DoneState):
            del self.done_groups[key]
        if state is not None and state != previous:
            table = self.open_groups if isinstance(state, GroupState) else self.done_groups
            table[key] = state.to_dict()


#: How many of a result's missing (or failed) item indexes its outline lists: the rest are counted and digested.
OUTLINE_SAMPLE = 100


def outline_of(values: Any) -> tuple[list[Any], int, str | None]:
    """A list as an outline carries it, whatever its length: the first :data:`OUTLINE_SAMPLE`, the count, a sha256."""
    if not isinstance(values, list):
        return [], 0, None
    return values[:OUTLINE_SAMPLE], len(values), hashlib.sha256(dumps(values)).hexdigest()


def dead_lettered_result(result: dict[str, Any], failure: Undeliverable) -> dict[str, Any]:
    """What is sent in place of a result that cannot be written: its outline, status ``dead-lettered``, and where the full one is.

    The full result is in the dead letters (cut to fit, with its size and sha256, ``failure``): a reader of
    the results still learns that the group completed, how, and what to look for. The outline always fits a
    record: the missing and failed indexes are a sample of :data:`OUTLINE_SAMPLE`, their count and their sha256.
    """
    missing, missing_count, missing_sha256 = outline_of(result.get("missing"))
    failed, failed_count, failed_sha256 = outline_of(result.get("failed"))
    return {
        "correlation_id": result.get("correlation_id"),
        "aggregator": result.get("aggregator"),
        "status": DEAD_LETTERED,
        "reason": result.get("reason"),
        "completed_status": result.get("status"),
        "expected_count": result.get("expected_count"),
        "missing": missing,
        "missing_count": missing_count,
        "missing_sha256": missing_sha256,
        "failed": failed,
        "failed_count": failed_count,
        "failed_sha256": failed_sha256,
        "opened_ms": result.get("opened_ms"),
        "deadline_ms": result.get("deadline_ms"),
        "completed_ms": result.get("completed_ms"),
        "error": failure.problem[:500],
        "size_bytes": failure.size_bytes,
        "sha256": failure.sha256,
    }


def invalid_result(correlation_id: str, aggregator: str, reason: str, error: str) -> dict[str, Any]:
    """The result of a group that could not even be split (the input is in the dead letters): status ``invalid``."""
    return {
        "correlation_id": correlation_id,
        "aggregator": aggregator,
        "status": "invalid",
        "reason": reason,
        "error": error[:500],
        "expected_count": None,
        "items": [],
        "missing": [],
        "failed": [],
    }


async def send_result(event: EventT[bytes], outputs: Sequence[Output], *, agent: str) -> None:
    """Send a group's result outputs, for a stage that keeps no state (items inline); one too large goes out as an outline.

    The full result is in the dead letters (:func:`app.runtime.keyed.send_checked`), and its
    :func:`dead_lettered_result` takes its place, so the group still has exactly one result.
    """
    failed = await send_checked(event, outputs, agent=agent, step="emit")
    outlines = [replace(failure.output, value=dead_lettered_result(failure.output.value, failure)) for failure in failed]
    if outlines:
        await send_checked(event, outlines, agent=agent, step="emit")


class Aggregation:
    """The aggregate stage: ``handle(event, message)`` for 'open', 'item', 'items' (a chunk's outcomes), 'tick' and 'force'.

    ``open_groups`` holds open groups, ``done_groups`` completed ones for the done retention (late items are
    counted there, never merged), ``deadlines`` the deadline index of both. All keyed by correlation id.
    Every change goes through the keyed-state runtime (:class:`app.runtime.keyed.KeyedState`): a result that
    cannot be written leaves its group done with status ``dead-lettered``, the full result in the dead
    letters and a :func:`dead_lettered_result` sent in its place; other groups go on.
    """

    def __init__(
        self,
        *,
        agent: str,
        config: AggregatorConfig,
        open_groups: TableT[str, Any],
        done_groups: TableT[str, Any],
        deadlines: TableT[str, Any],
        outputs: ResultOutputs,
        current: TableT[str, Any] | None = None,
        items: faust.TopicT | None = None,
    ) -> None:
        self.agent = agent
        #: where a re-requested item goes (``AggregatorConfig.rerequest_after_ms``): the items stage's input
        self.items = items
        #: ``complete_on_new_group``: each partition's open group of parts, by partition number
        self.current = current
        #: ``complete_at_batch_end``: the keys the part being handled brought parts to (completed at its end)
        self._in_batch: dict[str, None] = {}
        self.config = config
        self.outputs = outputs
        self.store = GroupStore(open_groups, done_groups)
        self.deadline_index = DeadlineIndex(deadlines)
        self.keyed: KeyedState[AggregateState] = KeyedState(
            agent=agent,
            store=self.store,
            deadlines=self.deadline_index,
            undeliverable=self._undeliverable,
            oversized=self._oversized,
            step="merge",
        )
        #: items that arrived after their group completed (counted, never merged); also per group in the table
        self.late_items = 0
        #: groups an operator forced to complete or discard (:meth:`_on_force`)
        self.forced = 0
        #: the position in its record of the bundled message being handled (:meth:`_on_bundled`)
        self._in_record = 0
        #: the event being handled, and the result and context of the completion being applied (:meth:`_change`):
        #: an undeliverable result's outline is made from them (a flow's output is its resume message, not the result)
        self._event: EventT[bytes] | None = None
        self._completing: tuple[dict[str, Any], Any] | None = None

    @property
    def open_groups(self) -> TableT[str, Any]:
        return self.store.open_groups

    @property
    def done_groups(self) -> TableT[str, Any]:
        return self.store.done_groups

    async def handle(self, event: EventT[bytes], message: Any) -> None:
        if not isinstance(message, dict):
            raise InvalidMessage(f"{self.agent}: a message must be a JSON object, got {type(message).__name__}")
        now = now_ms()
        kind = message.get("kind")
        if kind == "tick":
            await self._on_tick(event, now)
        elif kind == "force":
            await self._on_force(event, message, now)
        elif kind == "bundle":
            await self._on_bundle(event, message, now)
        else:
            await self._on_message(event, message, now)

    async def _on_bundle(self, event: EventT[bytes], bundle: dict[str, Any], now: int) -> None:
        """A bundle of messages for this partition (:func:`send_bundled`): each handled alone, a bad one dead-lettered alone."""
        self._in_record = 0
        await each_bundled(event, bundle, agent=self.agent, handle=functools.partial(self._on_bundled, now=now))

    async def _on_bundled(self, event: EventT[bytes], message: Any, *, now: int) -> None:
        self._in_record += 1  # a part's position in its record: in order, bundles are handled one message after the other
        if not isinstance(message, dict) or message.get("kind") in ("tick", "bundle", "force"):
            raise InvalidMessage(f"{self.agent}: a bundle holds 'open', 'item', 'items' and 'part' messages, got {message!r:.200}")
        await self._on_message(event, message, now, in_record=self._in_record)

    def _change(
        self,
        event: EventT[bytes],
        correlation_id: str,
        previous: AggregateState | None,
        transition: GroupTransition,
        rejected: tuple[str, ...] = (),
    ) -> Change[AggregateState]:
        """The core's transition as the runtime's change: the state, the result's outputs, the deadline to file."""
        state: AggregateState | None = transition.done if transition.done is not None else transition.state
        deadlines: tuple[tuple[str, int], ...] = ()
        due = state.due_ms(self.config) if isinstance(state, GroupState) else None
        # after an ask (its entry just came due and was taken), the group's next time is filed anew
        if due is not None and (transition.rerequest or not self._filed(previous, due)):
            deadlines = (("group", due),)
        elif isinstance(state, DoneState) and not isinstance(previous, DoneState):
            deadlines = (("done", state.expires_ms),)
        outputs = tuple(output for result in transition.emits for output in self.outputs(event, correlation_id, result, transition.context))
        if transition.rerequest and isinstance(state, GroupState):
            outputs += self._rerequests(correlation_id, state, transition.rerequest)
        for result in transition.emits:
            metrics.aggregate_completed(self.config.name, str(result.get("status")), str(result.get("reason")))
        if isinstance(state, GroupState) and isinstance(previous, GroupState) and state.duplicates > previous.duplicates:
            metrics.aggregate_parts(self.config.name, duplicates=state.duplicates - previous.duplicates)
        self._completing = (transition.emits[0], transition.context) if transition.emits else None
        if transition.rejected is not None:
            rejected = (*rejected, transition.rejected)
        return Change(state=state, outputs=outputs, rejected=rejected, deadlines=deadlines)

    def _rerequests(self, correlation_id: str, state: GroupState, indexes: Sequence[int]) -> tuple[Output, ...]:
        """The missing items asked for again: one item message each, keyed apart from the first (``<id>#<index>@<n>``),
        so that they may go to another partition, hence another items worker, than a stuck one. Their outcomes merge
        by index, once, whichever comes first."""
        if self.items is None or state.payloads is None:
            return ()
        total = state.expected_count if state.expected_count is not None else len(state.payloads)
        outputs = []
        for index in indexes:
            message: dict[str, Any] = {
                "correlation_id": correlation_id,
                "total": total,
                "items": [{"index": index, "last": index == total - 1, "payload": state.payloads[index]}],
                "rerequest": state.rerequested,
            }
            if state.origin is not None:
                message["origin"] = state.origin
            key = f"{correlation_id}#{index}@{state.rerequested}"
            outputs.append(Output(self.items, key, message, what=f"item {index} of {correlation_id!r} asked for again"))
        log.info("%s: %s asks again for %d missing item(s) (time %d)", self.agent, correlation_id, len(outputs), state.rerequested)
        return tuple(outputs)

    def _filed(self, previous: AggregateState | None, due: int) -> bool:
        """Whether the group's deadline entry already stands for ``due``: one filed at ``due`` or earlier.

        An entry that comes due before the group does is filed again at the group's deadline by the walk
        (:meth:`app.deadlines.DeadlineIndex.walk_keys`), so an inactivity deadline that moves on with every
        merge costs no index write per merge, only one per quiet period.
        """
        earlier = previous.due_ms(self.config) if isinstance(previous, GroupState) else None
        return earlier is not None and earlier <= due

    def _undeliverable(
        self, key: str, previous: Any, change: Change[AggregateState], failures: Sequence[Undeliverable]
    ) -> Change[AggregateState]:
        """A result that cannot be written: the group is done, ``dead-lettered``, and an outline of the result goes instead."""
        state = change.state
        if not isinstance(state, DoneState) or self._event is None or self._completing is None:
            return drop_undeliverable(key, previous, change, failures)
        failure = failures[0]
        result, context = self._completing
        return replace(
            change,
            state=replace(state, status=DEAD_LETTERED, error=failure.problem[:500]),
            outputs=tuple(self.outputs(self._event, key, dead_lettered_result(result, failure), context)),
        )

    def _oversized(self, key: str, previous: Any, change: Change[AggregateState], problem: str) -> Change[AggregateState]:
        """An open group grown too large to store completes there and then, partial (reason ``too-large``), with what it has.

        Its result is then as large, so it goes the way of a result that cannot be written (:meth:`_undeliverable`):
        the group done ``dead-lettered``, the result in the dead letters, an outline sent instead. What arrives
        for it later is counted late.
        """
        state = change.state
        if not isinstance(state, GroupState) or self._event is None:
            return Change(state=previous, rejected=(*change.rejected, problem))
        transition = complete_now(state, self.config, "partial", TOO_LARGE, now_ms())
        completed = self._change(self._event, key, previous, transition)
        done = completed.state
        if isinstance(done, DoneState):  # its later outcomes are in no result: :meth:`_in_no_result` dead-letters them
            completed = replace(completed, state=replace(done, error=f"{TOO_LARGE}: {problem}"[:500]))
        return replace(completed, rejected=change.rejected)

    async def _apply(
        self,
        event: EventT[bytes],
        correlation_id: str,
        change: Change[AggregateState],
        previous: AggregateState | None,
    ) -> None:
        self._event = event
        try:
            await self.keyed.apply(event, correlation_id, previous, change)
        finally:
            self._event, self._completing = None, None

    async def _on_message(self, event: EventT[bytes], message: dict[str, Any], now: int, *, in_record: int = 0) -> None:
        agent = self.agent
        correlation_id = message.get("correlation_id")
        if not isinstance(correlation_id, str) or not correlation_id:
            raise InvalidMessage(f"{agent}: field 'correlation_id' must be a non-empty string, got {correlation_id!r}")
        kind = message.get("kind")
        if kind == "part":
            await self._on_part(event, correlation_id, message, now, in_record)
            return
        if kind == "open":
            await self._open(event, correlation_id, message, message.get("total"), now)
            return
        outcomes: Any
        if kind == "item":
            outcomes = [message]
        elif kind == "items":
            outcomes = message.get("items")
            if not isinstance(outcomes, list) or not outcomes or not all(isinstance(outcome, dict) for outcome in outcomes):
                raise InvalidMessage(f"{agent}: 'items' of {correlation_id!r} needs a non-empty list of objects, got {outcomes!r:.200}")
        else:
            raise InvalidMessage(f"{agent}: field 'kind' must be 'open', 'item', 'items', 'part', 'tick' or 'force', got {kind!r}")
        folded = message.get("open")  # the group's open, come with its outcomes (a split of one chunk)
        if folded is not None and not isinstance(folded, dict):
            raise InvalidMessage(f"{agent}: field 'open' of {correlation_id!r} must be an object, got {type(folded).__name__}")
        origin = message.get("origin") if isinstance(message.get("origin"), str) else None
        await self._merge(event, correlation_id, outcomes, message.get("total"), now, folded, origin)

    def _open_fields(self, correlation_id: str, opened: dict[str, Any], total: Any) -> int | None:
        deadline_ms = opened.get("deadline_ms")
        good_deadline = deadline_ms is None or (isinstance(deadline_ms, int) and not isinstance(deadline_ms, bool))
        if not good_deadline or not (total is None or (isinstance(total, int) and total > 0)):
            raise InvalidMessage(
                f"{self.agent}: 'open' of {correlation_id!r} needs an integer (or null) deadline_ms and a positive total, "
                f"got {opened!r:.200}"
            )
        return deadline_ms

    async def _open(self, event: EventT[bytes], correlation_id: str, opened: dict[str, Any], total: Any, now: int) -> None:
        deadline_ms = self._open_fields(correlation_id, opened, total)
        previous = self._indexed(correlation_id)
        origin = opened.get("origin") if isinstance(opened.get("origin"), str) else None
        if self._reused(previous, origin):
            await self._refuse_reused(event, correlation_id, previous, opened, origin, opened_here=True)
            return
        if isinstance(previous, DoneState):
            return  # a redelivered open of a completed group
        payloads = opened.get("items") if isinstance(opened.get("items"), list) else None
        transition = on_open(
            previous,
            correlation_id,
            total,
            deadline_ms,
            now,
            config=self.config,
            context=opened.get("context"),
            origin=origin,
            payloads=payloads,
        )
        await self._apply(event, correlation_id, self._change(event, correlation_id, previous, transition), previous)

    @staticmethod
    def _reused(previous: AggregateState | None, origin: str | None) -> bool:
        """Whether a message split from ``origin`` is for another input than the one the key's group was split from."""
        return previous is not None and previous.origin is not None and origin is not None and previous.origin != origin

    async def _refuse_reused(
        self,
        event: EventT[bytes],
        correlation_id: str,
        previous: AggregateState | None,
        message: dict[str, Any],
        origin: str | None,
        *,
        opened_here: bool,
    ) -> None:
        """A second input reuses the id of a group split from another (a different order with the same order id): its
        messages are dead-lettered (reason ``duplicate-id``), never merged into the other's group, and its open (its
        own, or folded into its only chunk) gets its one result, ``invalid``, keyed by the id."""
        error = (
            f"{self.agent}: {correlation_id!r} is the id of a group split from {previous.origin if previous else None}; "
            f"this message comes from {origin} (another input reusing the id): not merged"
        )
        outputs: tuple[Output, ...] = ()
        if opened_here:
            result = invalid_result(correlation_id, self.config.name, "duplicate-id", error)
            context = message.get("context") if message.get("kind") == "open" else (message.get("open") or {}).get("context")
            outputs = tuple(self.outputs(event, correlation_id, result, context))
        refused = Refusal("duplicate-id", error[:500], key=correlation_id, value=message)
        await self._apply(event, correlation_id, Change(state=previous, outputs=outputs, rejected=(refused,)), previous)

    def _outcomes(self, correlation_id: str, items: list[dict[str, Any]], total: Any) -> list[tuple[ItemOutcome, bool]]:
        if not (total is None or isinstance(total, int)) or isinstance(total, bool):
            raise InvalidMessage(f"{self.agent}: items of {correlation_id!r} need an integer 'total', got {total!r}")
        parsed = []
        for item in items:
            index = item.get("index")
            if not isinstance(index, int) or isinstance(index, bool):
                raise InvalidMessage(f"{self.agent}: item of {correlation_id!r} needs an integer 'index', got {index!r}")
            outcome = ItemOutcome(index=index, ok=bool(item.get("ok")), result=item.get("result"), error=item.get("error"))
            parsed.append((outcome, bool(item.get("last"))))
        return parsed

    async def _merge(
        self,
        event: EventT[bytes],
        correlation_id: str,
        items: list[dict[str, Any]],
        total: Any,
        now: int,
        opened: dict[str, Any] | None,
        origin: str | None = None,
    ) -> None:
        """Merge a message's item outcomes into their group: read once, folded in memory, applied once.

        ``opened``: the group's open came with them; it is applied first. Outcomes for a completed group
        (or after the one that completes it) are counted late by index, never merged.
        """
        outcomes = self._outcomes(correlation_id, items, total)
        deadline_ms = None if opened is None else self._open_fields(correlation_id, opened, total)
        previous = self._indexed(correlation_id)
        if self._reused(previous, origin):
            message = {"kind": "items", "correlation_id": correlation_id, "total": total, "items": items, "origin": origin}
            if opened is not None:
                message["open"] = opened
            await self._refuse_reused(event, correlation_id, previous, message, origin, opened_here=opened is not None)
            return
        if isinstance(previous, DoneState):
            late = self._count_late(previous, outcomes)
            if late != previous:
                lost = self._in_no_result(previous, late, correlation_id, outcomes)
                await self._apply(event, correlation_id, Change(state=late, rejected=lost), previous)
            return
        state = previous
        if opened is not None:
            context = opened.get("context")
            state = on_open(state, correlation_id, total, deadline_ms, now, config=self.config, context=context, origin=origin).state
        transition, rejected, taken = on_items(state, self.config, correlation_id, outcomes, total, now)
        if transition.done is not None:
            transition = replace(transition, done=self._count_late(transition.done, outcomes[taken:]))
        change = self._change(event, correlation_id, previous, transition, rejected)
        await self._apply(event, correlation_id, change, previous)

    def _indexed(self, correlation_id: str) -> AggregateState | None:
        """The key's state, for a split's open or outcomes: refused when the key holds a correlation group of parts."""
        state = self.keyed.load(correlation_id)
        if state is not None and state.position is not None:
            raise InvalidMessage(f"{self.agent}: {correlation_id!r} is a correlation group of parts, not a split's group (indexed items)")
        return state

    async def _on_part(self, event: EventT[bytes], correlation_id: str, message: dict[str, Any], now: int, in_record: int) -> None:
        """A part of a correlation group (:func:`tables.aggregates.on_part`): no index, placed by arrival.

        Its read position (partition, offset, place in its record) tells a redelivery from a new part. A key
        holds either correlation groups or a split's indexed groups, never both.
        """
        flag = message.get("flag", False)
        if not isinstance(flag, bool):
            raise InvalidMessage(f"{self.agent}: a part's 'flag' must be true or false, got {flag!r:.100}")
        previous = self.keyed.load(correlation_id)
        if isinstance(previous, GroupState | DoneState) and previous.position is None:
            raise InvalidMessage(f"{self.agent}: {correlation_id!r} is a split's group (indexed items), not a correlation group of parts")
        position = (event.message.partition, event.message.offset, in_record)
        timeout_ms = message.get("timeout_ms")
        if timeout_ms is not None and (not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0):
            raise InvalidMessage(f"{self.agent}: a part's 'timeout_ms' must be a positive integer or null, got {timeout_ms!r:.100}")
        part = Part(payload=message.get("payload"), position=position, flag=flag, context=message.get("context"), timeout_ms=timeout_ms)
        transition = on_part(previous, self.config, correlation_id, part, now)
        late = isinstance(previous, DoneState) and transition.done is not None and transition.done.late_parts > previous.late_parts
        if late:
            self.late_items += 1
            metrics.aggregate_parts(self.config.name, late=1)
        elif self.current is not None and not isinstance(previous, GroupState):
            await self._complete_current(event, correlation_id, now)
        if self.config.complete_at_batch_end:
            self._in_batch[correlation_id] = None
        await self._apply(event, correlation_id, self._change(event, correlation_id, previous, transition), previous)

    async def complete_batch(self, event: EventT[bytes]) -> None:
        """``complete_at_batch_end``: the part (a batch's records of one partition) is handled; every group it brought
        parts to and that is still open completes now (reason ``batch-end``), in the part's transaction."""
        keys, self._in_batch = list(self._in_batch), {}
        now = now_ms()
        for key in keys:
            await self._complete_open(event, key, now, BATCH_END)

    async def _complete_current(self, event: EventT[bytes], opening: str, now: int) -> None:
        """``complete_on_new_group``: ``opening`` opens a group, so the group open in the event's partition (another
        key's) completes first (:func:`tables.aggregates.on_new_group`), and ``opening`` is the partition's open group."""
        assert self.current is not None
        slot = str(event.message.partition)
        current = self.current.get(slot)
        if current is not None and current != opening:
            await self._complete_open(event, current, now, NEW_GROUP)
        self.current[slot] = opening

    async def _complete_open(self, event: EventT[bytes], key: str, now: int, reason: str) -> None:
        """Complete ``key``'s group now with what it has, if it is still open (:func:`tables.aggregates.on_new_group`)."""
        state = self.keyed.load(key)
        if isinstance(state, GroupState):
            transition = on_new_group(state, self.config, now, reason)
            await self._apply(event, key, self._change(event, key, state, transition), state)

    def _in_no_result(
        self, done: DoneState, counted: DoneState, correlation_id: str, outcomes: list[tuple[ItemOutcome, bool]]
    ) -> tuple[Refusal, ...]:
        """Late outcomes of a group that completed with what it had because it outgrew a record (reason ``too-large``),
        or whose result went to the dead letters: no result will hold them (its result names them missing), so each is
        dead-lettered with its outcome (reason ``late``). A late outcome of a group that completed whole, or by its
        timeout, is counted there, as before (the result names it missing)."""
        if done.error is None:
            return ()
        new = set(counted.late_indexes) - set(done.late_indexes)
        lost: list[Refusal] = []
        for outcome, _ in outcomes:
            if outcome.index in new:
                new.discard(outcome.index)
                error = (
                    f"{self.agent}: item {outcome.index} of {correlation_id!r} came after its group completed "
                    f"{done.status} ({done.error}): its outcome is in no result"
                )
                lost.append(Refusal("late", error[:500], key=correlation_id, value=outcome.to_dict()))
        return tuple(lost)

    def _count_late(self, done: DoneState, outcomes: list[tuple[ItemOutcome, bool]]) -> DoneState:
        updated = done
        for outcome, _ in outcomes:
            counted = on_late_item(updated, outcome.index)
            if counted != updated:
                self.late_items += 1
                metrics.aggregate_parts(self.config.name, late=1)
                updated = counted
        return updated

    async def _on_force(self, event: EventT[bytes], message: dict[str, Any], now: int) -> None:
        """An operator's force (:func:`force_message`): on one group, or on every open group of this partition.

        A group that is not open (completed, or never opened) is left alone: a force is not a way to reopen
        or to send a second result.
        """
        action = message.get("action")
        if action not in FORCE_ACTIONS:
            raise InvalidMessage(f"{self.agent}: a force needs 'action' in {list(FORCE_ACTIONS)}, got {action!r:.100}")
        correlation_id = message.get("correlation_id")
        if correlation_id is None:
            keys = self._open_keys(event)
        elif isinstance(correlation_id, str) and correlation_id:
            keys = [correlation_id]
        else:
            raise InvalidMessage(f"{self.agent}: a force's 'correlation_id' must be a non-empty string, got {correlation_id!r:.100}")
        for key in keys:
            previous = self.keyed.load(key)
            if isinstance(previous, GroupState):
                transition = on_force(previous, self.config, action, now)
                await self._apply(event, key, self._change(event, key, previous, transition), previous)
                self.forced += 1

    def _open_keys(self, event: EventT[bytes]) -> list[str]:
        """The open groups of the event's partition: the table's keys that weir's producers put in that partition."""
        topic, partition = event.message.topic, event.message.partition
        partitions = partitions_of(topic) or event.app.consumer.topic_partitions(topic)
        if not partitions:
            raise InvalidMessage(f"{self.agent}: the partition count of {topic!r} is not known yet; send the force again")
        return [key for key in list(self.store.open_groups.keys()) if key_partition(key.encode(), partitions) == partition]

    async def _on_tick(self, event: EventT[bytes], now: int) -> None:
        """Walks the deadline index from the last walked second to now: work per due entry, not per open group."""

        def due_ms(kind: str, state: AggregateState) -> int | None:
            if isinstance(state, GroupState):  # (a done mark's entry met by a reopened key's group: its own entry stands)
                return state.due_ms(self.config) if kind == "group" else None
            # A group's own deadline entry met after it completed is dropped; the done mark has its own entry.
            return state.expires_ms if kind == "done" else None

        def on_deadline(key: str, state: AggregateState, now_ms: int) -> Change[AggregateState]:
            if isinstance(state, GroupState):
                transition = on_expire(state, self.config, now_ms)
                return self._change(event, key, state, transition)
            return Change(state=None)  # the done mark's retention is over

        self._event = event
        try:
            await self.keyed.walk_deadlines(event, now, due_ms, on_deadline)
        finally:
            self._event, self._completing = None, None
