"""Counter triggers: a batched trigger consumer keyed by parent id, and its paged safety sweep.

Registrations, completions and sweep ticks all travel on the ``triggers`` topic keyed by parent id, and every table
here is keyed by parent id too: one partition owns all there is to know about a parent. A parent's trigger state and
fired marker go through one :class:`app.runtime.keyed.KeyedState`, whose deadline index (walked on sweep ticks) drops
each of them at the end of its retention. The sweep's source of truth is not here: it is the children's statuses,
committed with their work in their database (app/trigger_status.py, ``WEIR_TRIGGER_STATUS_DB``).

Batches under exactly_once: the agent takes a batch and handles it one source partition at a time, each part in one
exactly-once scope (``app.core.run_parts``): one commit covers a part's offsets and all they wrote and sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import faust
from faust.types import EventT, StreamT, TableT

from app.codec import DecodeError, dumps
from app.core import InvalidMessage, app, decode_event, handle_parts, now_ms, send_dead_letter, settings, signals, topics
from app.deadlines import DeadlineIndex
from app.errors import OutputFailed, describe_error
from app.runtime.keyed import Change, KeyedState, Output, Refusal, Undeliverable
from app.trigger_status import StatusSource, open_status_source
from tables.trigger_tables import SweepQueue, expiry_deadlines, fired_triggers, sweep_entries, trigger_states
from tables.triggers import (
    DEFAULT_WAKE_TOPIC,
    TRIGGERS_TOPIC,
    ChildCompletion,
    FiredState,
    TriggerConfig,
    TriggerState,
    TriggerTransition,
    Wake,
    expiry_due_ms,
    on_completion,
    on_expiry,
    on_register,
    on_sweep,
    sweep_asks,
    sweep_due_ms,
)

__all__ = ["CONFIG", "triggers_topic", "fired_topic", "stats"]

log = logging.getLogger(__name__)
AGENT = "triggers"
CONFIG = TriggerConfig(
    name="triggers",
    sweep_grace_ms=settings.sweep_grace_ms,
    done_retention_ms=settings.done_retention_ms,
    orphan_retention_ms=settings.trigger_orphan_retention_ms,
)
#: A trigger the sweep found still waiting is looked at again after this long (never sooner than one sweep period).
RECHECK_MS = max(settings.sweep_grace_ms, settings.sweep_interval_ms)


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(name), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


triggers_topic = _topic(TRIGGERS_TOPIC)
fired_topic = _topic(DEFAULT_WAKE_TOPIC)
topics.extra.extend([triggers_topic, fired_topic])
_wake_topics: dict[str, faust.TopicT] = {DEFAULT_WAKE_TOPIC: fired_topic}


class CountedTable:
    """A table seen through a write counter: every set and delete is counted (the figure: state writes per event)."""

    def __init__(self, table: TableT[str, Any]) -> None:
        self.table = table
        self.writes = 0

    def get(self, key: str, default: Any = None) -> Any:
        return self.table.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self.table[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.table[key] = value
        self.writes += 1

    def __delitem__(self, key: str) -> None:
        del self.table[key]
        self.writes += 1


states = CountedTable(trigger_states)
fired_markers = CountedTable(fired_triggers)
_counted = [states, fired_markers, CountedTable(sweep_entries), CountedTable(expiry_deadlines)]
# The indexes only get, set and delete keys: the counting view stands in for the table.
sweep_queue = SweepQueue(cast(TableT[str, Any], _counted[2]))
#: When each parent's state is due to go (fired markers and unfired state alike); the table keeps its first name.
expiry_index = DeadlineIndex(cast(TableT[str, Any], _counted[3]))


@dataclass
class Stats:
    """What this worker's trigger consumer did (logged on every sweep period; the figure: state writes per event)."""

    #: registrations and completions handled (sweep ticks are not counted)
    events: int = 0
    batches: int = 0
    completions: int = 0
    fired: dict[str, int] = field(default_factory=dict)
    #: unfired states dropped at the end of their retention, by dead-letter reason
    expired: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        #: sets and deletes of the trigger states table, and of every trigger table (with markers and indexes)
        state_writes = states.writes
        table_writes = sum(table.writes for table in _counted)
        per_event = state_writes / self.events if self.events else 0.0
        return (
            f"triggers stats: events={self.events} batches={self.batches} completions={self.completions} "
            f"state_writes={state_writes} table_writes={table_writes} state_writes_per_event={per_event:.4f} "
            f"fired={sum(self.fired.values())} fired_by={dict(sorted(self.fired.items()))} "
            f"expired={dict(sorted(self.expired.items()))}"
        )


stats = Stats()


@dataclass
class Parsed:
    """One decoded message of the ``triggers`` topic."""

    event: EventT[bytes]
    kind: str
    parent_id: str = ""
    body: dict[str, Any] = field(default_factory=dict)


def _parse(event: EventT[bytes]) -> Parsed:
    message = decode_event(event, what="triggers: message")
    if not isinstance(message, dict):
        raise InvalidMessage(f"triggers: a message must be a JSON object, got {type(message).__name__}")
    kind = message.get("kind")
    if kind == "sweep":
        return Parsed(event, kind)
    if kind not in ("register", "completion"):
        raise InvalidMessage(f"triggers: field 'kind' must be 'register', 'completion' or 'sweep', got {kind!r}")
    parent_id = message.get("parent_id")
    if not isinstance(parent_id, str) or not parent_id:
        raise InvalidMessage(f"triggers: {kind} needs a non-empty string 'parent_id', got {parent_id!r}")
    if kind == "register":
        expected = message.get("expected_count")
        wake_topic = message.get("wake_topic", DEFAULT_WAKE_TOPIC)
        if (
            isinstance(expected, bool)
            or not isinstance(expected, int)
            or expected <= 0
            or not isinstance(wake_topic, str)
            or not wake_topic
        ):
            raise InvalidMessage(
                f"triggers: registration of parent {parent_id!r} needs a positive integer 'expected_count' and a topic name "
                f"'wake_topic', got {expected!r}, {wake_topic!r}"
            )
    else:
        child_id, outcome = message.get("child_id"), message.get("outcome")
        if not isinstance(child_id, str) or not child_id or not isinstance(outcome, str) or not outcome:
            raise InvalidMessage(
                f"triggers: {kind} of a child of parent {parent_id!r} needs non-empty strings 'child_id' and 'outcome', "
                f"got {child_id!r}, {outcome!r}"
            )
    return Parsed(event, kind, parent_id, message)


def _load_state(parent_id: str) -> TriggerState | None:
    raw = states.get(parent_id)
    return None if raw is None else TriggerState.from_dict(raw)


def _load_fired(parent_id: str) -> FiredState | None:
    raw = fired_markers.get(parent_id)
    return None if raw is None else FiredState.from_dict(raw)


@dataclass(frozen=True)
class ParentState:
    """A parent's keyed state: its trigger (None once fired) and its fired marker (None until it fires)."""

    trigger: TriggerState | None
    fired: FiredState | None

    @classmethod
    def of(cls, trigger: TriggerState | None, fired: FiredState | None) -> ParentState | None:
        """The parent's state, or None when nothing is left of it (the key is deleted everywhere)."""
        return None if trigger is None and fired is None else cls(trigger, fired)


def _parts(state: ParentState | None) -> tuple[TriggerState | None, FiredState | None]:
    return (None, None) if state is None else (state.trigger, state.fired)


class _Parents:
    """The triggers' :class:`app.runtime.keyed.Store`: a trigger and its fired marker, each in its table."""

    def load(self, parent_id: str) -> ParentState | None:
        return ParentState.of(_load_state(parent_id), _load_fired(parent_id))

    def encoded_size(self, parent_id: str, state: ParentState) -> int:
        trigger = len(dumps(state.trigger.to_dict())) if state.trigger is not None else 0
        fired = len(dumps(state.fired.to_dict())) if state.fired is not None else 0
        return max(trigger, fired) + len(parent_id.encode())

    def save(self, parent_id: str, previous: ParentState | None, state: ParentState | None) -> None:
        (trigger_before, fired_before), (trigger, fired) = _parts(previous), _parts(state)
        for table, before, after in (
            (states, trigger_before, trigger),
            (fired_markers, fired_before, fired),
        ):
            if after != before:
                if after is not None:
                    table[parent_id] = after.to_dict()
                elif before is not None:
                    del table[parent_id]


def _wake_topic(name: str) -> faust.TopicT:
    topic = _wake_topics.get(name)
    if topic is None:
        topic = _wake_topics[name] = _topic(name)
    return topic


def _wake_outline(parent_id: str, change: Change[ParentState], failures: Sequence[Undeliverable]) -> Change[ParentState]:
    """A wake that cannot be written (a registration's context too large): the parent is still woken, by an outline."""
    outputs = []
    for output in change.outputs:
        failure = next((failure for failure in failures if failure.output is output), None)
        if failure is None:
            outputs.append(output)
            continue
        outline = {
            "parent_id": parent_id,
            "status": "dead-lettered",
            "error": failure.problem[:500],
            "size_bytes": failure.size_bytes,
            "sha256": failure.sha256,
        }
        outputs.append(replace(output, value=outline))
    return replace(change, outputs=tuple(outputs))


parents: KeyedState[ParentState] = KeyedState(
    agent=AGENT,
    store=_Parents(),
    deadlines=expiry_index,
    undeliverable=lambda key, _previous, change, failures: _wake_outline(key, change, failures),
    step="fire",
    deadline_kind="expiry",
)


def _due_ms(state: ParentState | None) -> int | None:
    return None if state is None else expiry_due_ms(state.trigger, state.fired, CONFIG)


def _change(
    parent_id: str,
    previous: ParentState | None,
    updated: ParentState | None,
    wakes: Sequence[Wake],
    *,
    filed: bool,
    rejected: tuple[Refusal, ...] = (),
) -> Change[ParentState]:
    """One parent's change: its state, its wakes, and its expiry filed in the index when no entry would find it.

    ``filed``: the key has an entry for its previous due time. An entry handed over at a later due time is filed
    again by the walk; only a due time that moved earlier (a firing's shorter retention) needs a new entry.
    """
    if updated is not None and updated.fired is not None and (previous is None or previous.fired is None):
        stats.fired[updated.fired.fired_by] = stats.fired.get(updated.fired.fired_by, 0) + 1
    due, due_before = _due_ms(updated), _due_ms(previous)
    refile = due is not None and (not filed or due_before is None or due < due_before)
    outputs = tuple(Output(_wake_topic(wake.topic), parent_id, wake.record, what="the wake") for wake in wakes)
    return Change(state=updated, outputs=outputs, rejected=rejected, deadlines=(due,) if refile and due is not None else ())


async def _write(
    event: EventT[bytes], parent_id: str, previous: ParentState | None, updated: ParentState | None, wakes: Sequence[Wake]
) -> None:
    """Apply what changed for one parent (once, whatever the number of events that led there) and send its wakes."""
    await parents.apply(event, parent_id, previous, _change(parent_id, previous, updated, wakes, filed=True))


def _on_deadline(parent_id: str, previous: ParentState, now: int) -> Change[ParentState]:
    """The parent's expiry came (its index entry is used up): the core says what goes, and what goes unfired is dead-lettered."""
    transition: TriggerTransition = on_expiry(previous.trigger, previous.fired, now, config=CONFIG)
    rejected: tuple[Refusal, ...] = ()
    if transition.expired is not None:
        expired = transition.expired
        stats.expired[expired.reason] = stats.expired.get(expired.reason, 0) + 1
        rejected = (Refusal(expired.reason, expired.error, key=parent_id, value=expired.record),)
    updated = ParentState.of(transition.state, transition.fired)
    wakes = [transition.wake] if transition.wake is not None else []
    return _change(parent_id, previous, updated, wakes, filed=False, rejected=rejected)


async def _apply_parent(parent_id: str, messages: Sequence[Parsed], now: int, newly_waiting: list[tuple[str, int]]) -> None:
    """All messages of one parent in this batch, in arrival order, folded in memory and written once."""
    previous = parents.load(parent_id)
    state_before, fired_before = _parts(previous)
    state, fired = state_before, fired_before
    wakes: list[Wake] = []
    completions: list[ChildCompletion] = []

    def count_completions() -> None:
        nonlocal state, fired
        if completions:
            transition = on_completion(state, fired, parent_id, completions, now, config=CONFIG)
            state, fired = transition.state, transition.fired
            wakes.extend([transition.wake] if transition.wake is not None else [])
            completions.clear()

    for parsed in messages:
        body = parsed.body
        if parsed.kind == "completion":
            completions.append(ChildCompletion(child_id=body["child_id"], outcome=body["outcome"]))
            stats.completions += 1
        else:
            count_completions()
            wake_topic = body.get("wake_topic", DEFAULT_WAKE_TOPIC)
            transition = on_register(
                state, fired, parent_id, body["expected_count"], wake_topic, now, config=CONFIG, context=body.get("context")
            )
            for problem in transition.rejected:
                await send_dead_letter(parsed.event, reason="rejected", error=problem, agent=AGENT, step="register")
            state, fired = transition.state, transition.fired
            wakes.extend([transition.wake] if transition.wake is not None else [])
    count_completions()
    if state is not None and state.registered and (state_before is None or not state_before.registered):
        due = sweep_due_ms(state, CONFIG)
        if due is not None:
            newly_waiting.append((parent_id, due))
    await _write(messages[-1].event, parent_id, previous, ParentState.of(state, fired), wakes)


_status_source: StatusSource | None = None


def status_source() -> StatusSource | None:
    """The children's committed statuses (``WEIR_TRIGGER_STATUS_DB``), opened at the first sweep that needs them."""
    global _status_source
    if _status_source is None and settings.trigger_status_db:
        _status_source = open_status_source(settings.trigger_status_db)
    return _status_source


async def _committed_statuses(page: Sequence[str], now: int) -> dict[str, dict[str, str]]:
    """What the status source says of the page's parents that the sweep may fire; nothing when it cannot answer in time
    (the step then fires nothing, and its triggers are looked at again later)."""

    def fireable(parent_id: str) -> bool:
        trigger, fired = _parts(parents.load(parent_id))
        return sweep_asks(trigger, fired, now, CONFIG)

    asked = [parent_id for parent_id in page if fireable(parent_id)]
    if not asked:
        return {}
    try:
        source = status_source()
        if source is None:
            return {}
        return await asyncio.wait_for(source.statuses(asked), timeout=settings.sweep_query_timeout_ms / 1000)
    except Exception as error:  # the database is away or slow: the sweep is a safety net, it tries again later
        log.warning("triggers: the status source did not answer for %d parents: %s", len(asked), describe_error(error))
        return {}


async def _sweep(event: EventT[bytes], now: int) -> None:
    """One sweep step of this partition: a page of triggers past their grace, then the parents whose retention ended."""
    partition = event.message.partition
    committed = await _committed_statuses(sweep_queue.due(partition, now, settings.sweep_page_size), now)

    async def visit(parent_id: str) -> int | None:
        previous = parents.load(parent_id)
        state, fired = _parts(previous)
        transition = on_sweep(state, fired, committed.get(parent_id, {}), now, config=CONFIG)
        if transition.fired is not None and fired is None:
            log.info("triggers: the sweep fires parent %r (completion events were lost)", parent_id)
            updated = ParentState.of(transition.state, transition.fired)
            await _write(event, parent_id, previous, updated, [transition.wake] if transition.wake else [])
            return None
        if transition.state is not None and transition.state.registered:
            return now + RECHECK_MS  # children still running: look again in a later round
        return None

    more = await sweep_queue.step(partition, now, settings.sweep_page_size, visit)
    if more:
        # The next page comes behind whatever is queued in the partition now: the sweep yields to live traffic.
        await signals.send(triggers_topic.get_topic_name(), dumps({"kind": "sweep"}), partition)

    # Fired markers and unfired state at the end of their retention (entries of the older kind 'fired' included).
    await parents.walk_deadlines(event, now, lambda _kind, state: _due_ms(state), _on_deadline)


async def _handle_partition(events: Sequence[EventT[bytes]], now: int) -> None:
    partition = events[0].message.partition
    by_parent: dict[str, list[Parsed]] = {}
    sweep: EventT[bytes] | None = None
    for event in events:
        try:
            parsed = _parse(event)
        except DecodeError as error:
            await send_dead_letter(event, reason="undecodable", error=str(error), agent=AGENT, step="decode")
            continue
        except InvalidMessage as error:
            await send_dead_letter(event, reason="invalid", error=str(error), agent=AGENT, step="validate")
            continue
        if parsed.kind == "sweep":
            sweep = event  # several sweep ticks in one batch make one step
        else:
            stats.events += 1
            by_parent.setdefault(parsed.parent_id, []).append(parsed)
    newly_waiting: list[tuple[str, int]] = []
    for parent_id, messages in by_parent.items():
        try:
            await _apply_parent(parent_id, messages, now, newly_waiting)
        except OutputFailed:
            raise  # the producer refused it: the worker stops, nothing is skipped
        except Exception as error:  # a bug, not bad input: dead-letter this parent's messages, go on with the others
            log.exception("triggers: unexpected error while handling parent %r", parent_id)
            for parsed in messages:
                await send_dead_letter(parsed.event, reason="error", error=describe_error(error), agent=AGENT, step="handle")
    sweep_queue.file(partition, newly_waiting)
    if sweep is not None:
        try:
            await _sweep(sweep, now)
        except OutputFailed:
            raise
        except Exception as error:
            log.exception("triggers: sweep step of partition %d failed", partition)
            await send_dead_letter(sweep, reason="error", error=describe_error(error), agent=AGENT, step="sweep")


async def _handle_part(events: Sequence[EventT[bytes]]) -> None:
    stats.batches += 1
    await _handle_partition(events, now_ms())  # an OutputFailed goes up: the batch fails, nothing of it is skipped


@app.agent(triggers_topic)
async def triggers(stream: StreamT[bytes]) -> None:
    """Reads registrations, completions and sweep ticks keyed by parent id, in batches (``app.core.run_parts``)."""
    await handle_parts(stream, _handle_part, size=settings.trigger_batch_size, wait_ms=settings.trigger_batch_wait_ms)


_last_stats = ""


async def send_sweeps() -> None:
    """Each trigger worker sends a sweep tick to the partitions it owns; the step runs in stream order."""
    global _last_stats
    line = stats.line()
    if line != _last_stats:
        log.info("%s", line)
        _last_stats = line
    topic_name = triggers_topic.get_topic_name()
    try:
        owned = [tp.partition for tp in app.consumer.assignment() if tp.topic == topic_name]
        for partition in owned:
            await signals.send(topic_name, dumps({"kind": "sweep"}), partition)
    except Exception as error:  # not assigned yet, or mid-rebalance: the next period tries again
        log.debug("sweep tick skipped: %s", error)


app.timer(interval=settings.sweep_interval_ms / 1000)(send_sweeps)

#: How often a triggers worker deletes the children's status rows past WEIR_TRIGGER_STATUS_RETENTION_MS.
STATUS_PURGE_EVERY_S = max(1.0, min(600.0, settings.trigger_status_retention_ms / 10_000))


async def purge_statuses() -> None:
    """Delete the status rows older than their retention, so that the table does not grow forever.

    A row is read by the sweep only for a trigger still waiting, and a trigger waits at most its orphan
    retention after its last change; the default retention is twice that. Every triggers worker purges (a
    DELETE by age: doing it twice changes nothing). A database away: the next period tries again.
    """
    source = status_source()
    if source is None:
        return
    try:
        deleted = await asyncio.wait_for(
            source.purge_older(now_ms() - settings.trigger_status_retention_ms), timeout=settings.sweep_query_timeout_ms / 1000
        )
    except Exception as error:
        log.warning("triggers: the status rows could not be purged: %s", describe_error(error))
        return
    if deleted:
        log.info("triggers: %d children's status rows past their retention deleted", deleted)


app.timer(interval=STATUS_PURGE_EVERY_S)(purge_statuses)
