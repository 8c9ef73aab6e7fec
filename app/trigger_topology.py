"""Counter triggers (seed 001) compiled into one stage: a batched trigger consumer keyed by parent id, and its paged safety sweep.

Registrations, completions and sweep ticks all travel on the ``triggers`` topic keyed by parent id, and every table
here is keyed by parent id too: one partition owns all there is to know about a parent. A parent's trigger state and
fired marker go through one :class:`app.runtime.keyed.KeyedState`, whose deadline index (walked on sweep ticks) drops
each of them at the end of its retention. The sweep's source of truth is not here: it is the children's statuses,
committed with their work in their database (:mod:`app.trigger_status`), read through a :class:`StatusSource`.

A batch's part of one partition is folded per parent in memory and written once per parent (fewer writes than events).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from faust.types import EventT, TableT

from weir.app.codec import DecodeError, dumps
from weir.app.deadlines import DeadlineIndex
from weir.app.errors import OutputFailed, describe_error
from weir.app.runtime import environment
from weir.app.runtime.keyed import Change, KeyedState, Output, Refusal, Undeliverable
from weir.app.shell import InvalidMessage, decode_event, now_ms, send_dead_letter
from weir.app.stages import Stage, Timer, Wiring
from weir.app.trigger_status import StatusSource
from weir.tables.trigger_tables import SweepQueue
from weir.tables.triggers import (
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

__all__ = ["TriggerTopology", "ParentState", "Stats", "CountedTable"]

log = logging.getLogger(__name__)
AGENT = "triggers"


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


@dataclass
class Stats:
    """What this worker's trigger consumer did (logged on every sweep period; the figure: state writes per event)."""

    counted: list[CountedTable] = field(default_factory=list)
    #: registrations and completions handled (sweep ticks are not counted)
    events: int = 0
    batches: int = 0
    completions: int = 0
    fired: dict[str, int] = field(default_factory=dict)
    #: unfired states dropped at the end of their retention, by dead-letter reason
    expired: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        #: sets and deletes of the trigger states table, and of every trigger table (with markers and indexes)
        state_writes = self.counted[0].writes if self.counted else 0
        table_writes = sum(table.writes for table in self.counted)
        per_event = state_writes / self.events if self.events else 0.0
        return (
            f"triggers stats: events={self.events} batches={self.batches} completions={self.completions} "
            f"state_writes={state_writes} table_writes={table_writes} state_writes_per_event={per_event:.4f} "
            f"fired={sum(self.fired.values())} fired_by={dict(sorted(self.fired.items()))} "
            f"expired={dict(sorted(self.expired.items()))}"
        )


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

    def __init__(self, states: CountedTable, fired_markers: CountedTable) -> None:
        self.states = states
        self.fired_markers = fired_markers

    def load(self, parent_id: str) -> ParentState | None:
        raw_state, raw_fired = self.states.get(parent_id), self.fired_markers.get(parent_id)
        return ParentState.of(
            None if raw_state is None else TriggerState.from_dict(raw_state), None if raw_fired is None else FiredState.from_dict(raw_fired)
        )

    def encoded_size(self, parent_id: str, state: ParentState) -> int:
        trigger = len(dumps(state.trigger.to_dict())) if state.trigger is not None else 0
        fired = len(dumps(state.fired.to_dict())) if state.fired is not None else 0
        return max(trigger, fired) + len(parent_id.encode())

    def save(self, parent_id: str, previous: ParentState | None, state: ParentState | None) -> None:
        (trigger_before, fired_before), (trigger, fired) = _parts(previous), _parts(state)
        for table, before, after in ((self.states, trigger_before, trigger), (self.fired_markers, fired_before, fired)):
            if after != before:
                if after is not None:
                    table[parent_id] = after.to_dict()
                elif before is not None:
                    del table[parent_id]


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


class TriggerTopology:
    """The ``triggers`` topic, the wake topics, the trigger tables and the one stage that keeps them.

    ``status_source``: the children's committed statuses (the sweep's source of truth), opened at the first sweep that
    needs it; None (or a factory giving None): the sweep fires nothing.
    """

    def __init__(self, wiring: Wiring, *, status_source: Callable[[], StatusSource | None] | None = None) -> None:
        settings = wiring.settings
        self.settings = settings
        self._wiring = wiring
        self.config = TriggerConfig(
            name="triggers",
            sweep_grace_ms=settings.sweep_grace_ms,
            done_retention_ms=settings.done_retention_ms,
            orphan_retention_ms=settings.trigger_orphan_retention_ms,
        )
        #: a trigger the sweep found still waiting is looked at again after this long (never sooner than one sweep period)
        self.recheck_ms = max(settings.sweep_grace_ms, settings.sweep_interval_ms)
        self.topic = wiring.topic_named(TRIGGERS_TOPIC)
        self.fired_topic = wiring.topic_named(DEFAULT_WAKE_TOPIC)
        self._wake_topics: dict[str, Any] = {DEFAULT_WAKE_TOPIC: self.fired_topic}
        self._open_status_source = status_source
        self._status_source: StatusSource | None = None
        table = wiring.table
        self.states = CountedTable(
            table(
                "triggers",
                "Counter triggers by parent id: expected children, the children counted so far with their outcome (each once), "
                "the wake topic; or, before the parent registered, the completions remembered (value: "
                "tables.triggers.TriggerState). Dropped unfired, to the dead letters, WEIR_TRIGGER_ORPHAN_RETENTION_MS after "
                "the last event that changed it.",
            )
        )
        self.fired_markers = CountedTable(
            table(
                "triggers_fired",
                "Fired triggers by parent id, kept for the done retention so that redelivered or late completions never fire "
                "them twice; counts the completions absorbed (value: tables.triggers.FiredState).",
            )
        )
        sweep_entries = CountedTable(
            table(
                "trigger_sweep",
                "The safety sweep's queue (tables.trigger_tables.SweepQueue): per partition, the registered triggers in the "
                "order the sweep may look at them ['<p>:<n>' = [parent id, due ms]], and the cursor '<p>:head' / end '<p>:tail'.",
            )
        )
        # The table keeps the name it had when it indexed fired markers only: entries already filed in it still come due.
        expiry_deadlines = CountedTable(
            table(
                "trigger_fired_deadlines",
                "Deadline index of the triggers' retention, fired markers and unfired state alike (app.deadlines.DeadlineIndex): "
                "per partition, the parents due each second.",
            )
        )
        self.stats = Stats(counted=[self.states, self.fired_markers, sweep_entries, expiry_deadlines])
        # The indexes only get, set and delete keys: the counting view stands in for the table.
        self.sweep_queue = SweepQueue(cast(TableT[str, Any], sweep_entries))
        #: when each parent's state is due to go (fired markers and unfired state alike)
        self.expiry_index = DeadlineIndex(cast(TableT[str, Any], expiry_deadlines))
        self.parents: KeyedState[ParentState] = KeyedState(
            agent=AGENT,
            store=_Parents(self.states, self.fired_markers),
            deadlines=self.expiry_index,
            undeliverable=lambda key, _previous, change, failures: _wake_outline(key, change, failures),
            step="fire",
            deadline_kind="expiry",
        )
        self._last_stats = ""

    # -- the stage ---------------------------------------------------------------------------------------------

    def stages(self) -> list[Stage]:
        return [self.stage()]

    def stage(self) -> Stage:
        """Reads registrations, completions and sweep ticks keyed by parent id, in batches; a sweep tick every
        ``WEIR_SWEEP_INTERVAL_MS``, and the children's old status rows purged on a timer of their own."""
        settings = self.settings
        purge_every_s = max(1.0, min(600.0, settings.trigger_status_retention_ms / 10_000))
        return Stage(
            AGENT,
            (self.topic,),
            self.handle_part,
            ticked=(self.topic,),
            tick_value={"kind": "sweep"},
            tick_every_ms=settings.sweep_interval_ms,
            batch_size=settings.trigger_batch_size,
            batch_wait_ms=settings.trigger_batch_wait_ms,
            timers=(Timer(settings.sweep_interval_ms / 1000, self.log_stats), Timer(purge_every_s, self.purge_statuses)),
        )

    async def handle_part(self, events: Sequence[EventT[bytes]]) -> None:
        self.stats.batches += 1
        await self._handle_partition(events, now_ms())  # an OutputFailed goes up: the batch fails, nothing of it is skipped

    async def _handle_partition(self, events: Sequence[EventT[bytes]], now: int) -> None:
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
                self.stats.events += 1
                by_parent.setdefault(parsed.parent_id, []).append(parsed)
        newly_waiting: list[tuple[str, int]] = []
        for parent_id, messages in by_parent.items():
            try:
                await self._apply_parent(parent_id, messages, now, newly_waiting)
            except OutputFailed:
                raise  # the producer refused it: the worker stops, nothing is skipped
            except Exception as error:  # a bug, not bad input: dead-letter this parent's messages, go on with the others
                log.exception("triggers: unexpected error while handling parent %r", parent_id)
                for parsed in messages:
                    await send_dead_letter(parsed.event, reason="error", error=describe_error(error), agent=AGENT, step="handle")
        self.sweep_queue.file(partition, newly_waiting)
        if sweep is not None:
            try:
                await self._sweep(sweep, now)
            except OutputFailed:
                raise
            except Exception as error:
                log.exception("triggers: sweep step of partition %d failed", partition)
                await send_dead_letter(sweep, reason="error", error=describe_error(error), agent=AGENT, step="sweep")

    # -- one parent's messages ---------------------------------------------------------------------------------

    def _wake_topic(self, name: str) -> Any:
        topic = self._wake_topics.get(name)
        if topic is None:
            topic = self._wake_topics[name] = self._wiring.topic_named(name)
        return topic

    def _due_ms(self, state: ParentState | None) -> int | None:
        return None if state is None else expiry_due_ms(state.trigger, state.fired, self.config)

    def _change(
        self,
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
            self.stats.fired[updated.fired.fired_by] = self.stats.fired.get(updated.fired.fired_by, 0) + 1
        due, due_before = self._due_ms(updated), self._due_ms(previous)
        refile = due is not None and (not filed or due_before is None or due < due_before)
        outputs = tuple(Output(self._wake_topic(wake.topic), parent_id, wake.record, what="the wake") for wake in wakes)
        return Change(state=updated, outputs=outputs, rejected=rejected, deadlines=(due,) if refile and due is not None else ())

    async def _write(
        self, event: EventT[bytes], parent_id: str, previous: ParentState | None, updated: ParentState | None, wakes: Sequence[Wake]
    ) -> None:
        """Apply what changed for one parent (once, whatever the number of events that led there) and send its wakes."""
        await self.parents.apply(event, parent_id, previous, self._change(parent_id, previous, updated, wakes, filed=True))

    def _on_deadline(self, parent_id: str, previous: ParentState, now: int) -> Change[ParentState]:
        """The parent's expiry came (its index entry is used up): the core says what goes, and what goes unfired is dead-lettered."""
        transition: TriggerTransition = on_expiry(previous.trigger, previous.fired, now, config=self.config)
        rejected: tuple[Refusal, ...] = ()
        if transition.expired is not None:
            expired = transition.expired
            self.stats.expired[expired.reason] = self.stats.expired.get(expired.reason, 0) + 1
            rejected = (Refusal(expired.reason, expired.error, key=parent_id, value=expired.record),)
        updated = ParentState.of(transition.state, transition.fired)
        wakes = [transition.wake] if transition.wake is not None else []
        return self._change(parent_id, previous, updated, wakes, filed=False, rejected=rejected)

    async def _apply_parent(self, parent_id: str, messages: Sequence[Parsed], now: int, newly_waiting: list[tuple[str, int]]) -> None:
        """All messages of one parent in this batch, in arrival order, folded in memory and written once."""
        config = self.config
        previous = self.parents.load(parent_id)
        state_before, fired_before = _parts(previous)
        state, fired = state_before, fired_before
        wakes: list[Wake] = []
        completions: list[ChildCompletion] = []

        def count_completions() -> None:
            nonlocal state, fired
            if completions:
                transition = on_completion(state, fired, parent_id, completions, now, config=config)
                state, fired = transition.state, transition.fired
                wakes.extend([transition.wake] if transition.wake is not None else [])
                completions.clear()

        for parsed in messages:
            body = parsed.body
            if parsed.kind == "completion":
                completions.append(ChildCompletion(child_id=body["child_id"], outcome=body["outcome"]))
                self.stats.completions += 1
            else:
                count_completions()
                wake_topic = body.get("wake_topic", DEFAULT_WAKE_TOPIC)
                transition = on_register(
                    state, fired, parent_id, body["expected_count"], wake_topic, now, config=config, context=body.get("context")
                )
                for problem in transition.rejected:
                    await send_dead_letter(parsed.event, reason="rejected", error=problem, agent=AGENT, step="register")
                state, fired = transition.state, transition.fired
                wakes.extend([transition.wake] if transition.wake is not None else [])
        count_completions()
        if state is not None and state.registered and (state_before is None or not state_before.registered):
            due = sweep_due_ms(state, config)
            if due is not None:
                newly_waiting.append((parent_id, due))
        await self._write(messages[-1].event, parent_id, previous, ParentState.of(state, fired), wakes)

    # -- the safety sweep --------------------------------------------------------------------------------------

    def status_source(self) -> StatusSource | None:
        """The children's committed statuses, opened at the first sweep that needs them."""
        if self._status_source is None and self._open_status_source is not None:
            self._status_source = self._open_status_source()
        return self._status_source

    async def _committed_statuses(self, page: Sequence[str], now: int) -> dict[str, dict[str, str]]:
        """What the status source says of the page's parents that the sweep may fire; nothing when it cannot answer in
        time (the step then fires nothing, and its triggers are looked at again later)."""

        def fireable(parent_id: str) -> bool:
            trigger, fired = _parts(self.parents.load(parent_id))
            return sweep_asks(trigger, fired, now, self.config)

        asked = [parent_id for parent_id in page if fireable(parent_id)]
        if not asked:
            return {}
        try:
            source = self.status_source()
            if source is None:
                return {}
            return await asyncio.wait_for(source.statuses(asked), timeout=self.settings.sweep_query_timeout_ms / 1000)
        except Exception as error:  # the database is away or slow: the sweep is a safety net, it tries again later
            log.warning("triggers: the status source did not answer for %d parents: %s", len(asked), describe_error(error))
            return {}

    async def _sweep(self, event: EventT[bytes], now: int) -> None:
        """One sweep step of this partition: a page of triggers past their grace, then the parents whose retention ended."""
        partition = event.message.partition
        page_size = self.settings.sweep_page_size
        committed = await self._committed_statuses(self.sweep_queue.due(partition, now, page_size), now)

        async def visit(parent_id: str) -> int | None:
            previous = self.parents.load(parent_id)
            state, fired = _parts(previous)
            transition = on_sweep(state, fired, committed.get(parent_id, {}), now, config=self.config)
            if transition.fired is not None and fired is None:
                log.info("triggers: the sweep fires parent %r (completion events were lost)", parent_id)
                updated = ParentState.of(transition.state, transition.fired)
                await self._write(event, parent_id, previous, updated, [transition.wake] if transition.wake else [])
                return None
            if transition.state is not None and transition.state.registered:
                return now + self.recheck_ms  # children still running: look again in a later round
            return None

        more = await self.sweep_queue.step(partition, now, page_size, visit)
        if more:
            # The next page comes behind whatever is queued in the partition now: the sweep yields to live traffic.
            await environment.current().outlet.signal(self.topic, dumps({"kind": "sweep"}), partition)

        # Fired markers and unfired state at the end of their retention (entries of the older kind 'fired' included).
        await self.parents.walk_deadlines(event, now, lambda _kind, state: self._due_ms(state), self._on_deadline)

    # -- timers ------------------------------------------------------------------------------------------------

    async def log_stats(self) -> None:
        line = self.stats.line()
        if line != self._last_stats:
            log.info("%s", line)
            self._last_stats = line

    async def purge_statuses(self) -> None:
        """Delete the status rows older than their retention, so that the table does not grow forever.

        A row is read by the sweep only for a trigger still waiting, and a trigger waits at most its orphan
        retention after its last change; the default retention is twice that. Every triggers worker purges (a
        DELETE by age: doing it twice changes nothing). A database away: the next period tries again.
        """
        try:
            source = self.status_source()
        except Exception as error:  # a source that cannot be opened: the sweep says so too; try again next period
            log.warning("triggers: the status source could not be opened: %s", describe_error(error))
            return
        if source is None:
            return
        try:
            deleted = await asyncio.wait_for(
                source.purge_older(now_ms() - self.settings.trigger_status_retention_ms),
                timeout=self.settings.sweep_query_timeout_ms / 1000,
            )
        except Exception as error:
            log.warning("triggers: the status rows could not be purged: %s", describe_error(error))
            return
        if deleted:
            log.info("triggers: %d children's status rows past their retention deleted", deleted)
