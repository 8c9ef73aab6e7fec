"""The keyed-state runtime: the one place where a pattern's change to one key is checked, stored and sent.

A pattern is a pure core: for an input (or a deadline) and the key's state it returns a :class:`Change` —
the key's new state (None: delete it), the outputs to send, the inputs it rejects, the deadlines to file.
:meth:`KeyedState.apply` does the rest, in this order, for every pattern:

1. **check the new state and every output before anything is stored**: a state too large for its changelog
   record goes to the pattern's ``oversized`` hook (by default the input is refused, the key unchanged; an
   aggregate completes the group there and then). Each output is encoded and measured against the record
   limit (:func:`app.core.record_limit`). An output that cannot be written (too large, not serialisable) is a
   case of this key, not of the batch: the pattern's ``undeliverable`` hook says what the key becomes
   instead (an aggregate: its group done with status ``dead-lettered``, a small result in place of the
   full one), and the output itself goes to the dead letters cut to fit, with its size and sha256. A
   replacement that still cannot be written is dead-lettered too and dropped; nothing loops.
2. dead-letter what the pattern rejected;
3. store the new state and file its deadlines (a :class:`app.deadlines.DeadlineIndex`);
4. send the outputs, already encoded, in order. Under exactly_once they join the transaction that commits
   the input's offset with the state's changelog writes: a crash before the commit leaves none of them,
   one after leaves all. A transient send failure fails that commit, which aborts; the input replays.

Deadlines come back through :meth:`KeyedState.walk_deadlines` on a tick: the index hands over each due key,
the pattern's ``on_deadline`` returns a Change, and :meth:`apply` applies it like any other.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

import faust
from aiokafka.errors import IllegalOperation, ProducerFenced
from faust.types import EventT, TableT

from weir.app import metrics
from weir.app.codec import dumps
from weir.app.deadlines import DeadlineIndex
from weir.app.errors import OutputFailed, dead_letter_record, describe_error
from weir.app.runtime import environment
from weir.app.shell import message_headers, record_limit, send_dead_letter, send_dead_letter_record
from weir.app.shell import now_ms as wall_clock_ms

__all__ = [
    "Output",
    "Change",
    "Refusal",
    "Undeliverable",
    "KeyedState",
    "Store",
    "TableStore",
    "OutputFailed",
    "prepare_outputs",
    "send_checked",
    "send_prepared",
    "dead_letter_output",
    "dead_letter_outputs",
    "fingerprint",
]

log = logging.getLogger(__name__)

S = TypeVar("S")


@dataclass(slots=True)
class Output:
    """One message a change sends: to ``topic``, keyed by ``key``; ``value`` is JSON-able (or bytes, already encoded).

    This and the runtime's other values are slotted, not frozen: one or more are made per input, nothing changes one
    once made, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per field) takes three times as long.
    """

    topic: faust.TopicT
    key: str | None
    value: Any
    headers: tuple[tuple[str, bytes], ...] = ()
    #: where it goes to, for messages: "aggregates", "resume", ... (defaults to the topic's name)
    what: str = ""

    def describe(self) -> str:
        return self.what or self.topic.get_topic_name()


@dataclass(slots=True)
class Refusal:
    """An input refused with a reason of the pattern's own (``duplicate-order``, say) instead of 'rejected'.

    With ``key`` and ``value``, the dead letter is about the key's state rather than the input (state dropped on a
    deadline: the tick that found it is no message worth keeping): it names the key and holds ``value`` (JSON-able).
    """

    reason: str
    error: str
    key: str | None = None
    value: Any = None


@dataclass(slots=True)
class Change(Generic[S]):
    """What one input or one deadline does to one key: its new state (None deletes it), outputs, rejects, deadlines."""

    state: S | None
    outputs: tuple[Output, ...] = ()
    #: why inputs were refused: each one a dead letter, with reason 'rejected' (a string) or the refusal's own
    rejected: tuple[str | Refusal, ...] = ()
    #: absolute times (ms) at which the key's ``on_deadline`` must run; ``(kind, ms)`` for a pattern with several kinds
    deadlines: tuple[int | tuple[str, int], ...] = ()


@dataclass(slots=True)
class Undeliverable:
    """An output that cannot be written, and why: its encoded size and sha256 when it could be encoded."""

    output: Output
    problem: str
    encoded: bytes | None = None
    size_bytes: int = 0
    sha256: str = ""


@dataclass(slots=True)
class Prepared:
    """Outputs checked against the record limit: those ready to send (encoded), those that cannot be written."""

    ready: tuple[tuple[Output, bytes], ...] = ()
    undeliverable: tuple[Undeliverable, ...] = field(default=())


def fingerprint(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def prepare_outputs(outputs: Iterable[Output], limit: int) -> Prepared:
    """Encode every output and measure it against ``limit`` bytes; no I/O (a pure function, unit-tested)."""
    ready: list[tuple[Output, bytes]] = []
    failed: list[Undeliverable] = []
    for output in outputs:
        try:
            value = output.value if isinstance(output.value, bytes) else dumps(output.value)
        except Exception as error:  # orjson raises TypeError (and others) for what JSON cannot hold
            failed.append(Undeliverable(output, f"{output.describe()}: not serialisable ({describe_error(error)})"))
            continue
        key_size = len(output.key.encode()) if output.key is not None else 0
        header_size = sum(len(name) + len(raw) for name, raw in output.headers)
        size = len(value) + key_size + header_size
        if size > limit:
            problem = f"{output.describe()} of {output.key!r} is {size} bytes, more than a record may hold ({limit})"
            failed.append(Undeliverable(output, problem, value, len(value), fingerprint(value)))
            continue
        ready.append((output, value))
    return Prepared(tuple(ready), tuple(failed))


#: Send errors that say the producer's transaction is gone (fenced, aborted by a timeout): retrying cannot help.
TRANSACTION_STATE_ERRORS: tuple[type[BaseException], ...] = (IllegalOperation, ProducerFenced)

#: How often a send that fails (the producer refused to queue it: a full buffer, a lost connection) is tried.
SEND_ATTEMPTS = 3
#: The wait before the n-th retry of a refused send is n times this (on the environment's clock).
SEND_BACKOFF_S = 0.2


async def send_prepared(ready: Sequence[tuple[Output, bytes]]) -> None:
    """Send checked outputs in order; each send joins the current transaction (awaited: queued, not yet delivered).

    A send that fails is tried again (a refused send queued nothing), then :class:`OutputFailed` goes up and
    fails the batch: skipping the input would commit its state without its outputs. A send refused because the
    transaction is gone (fenced, or aborted by the broker's timeout) fails at once.
    """
    for output, value in ready:
        key = output.key.encode() if output.key is not None else None
        for attempt in range(1, SEND_ATTEMPTS + 1):
            try:
                await environment.send_record(output.topic, key, value, list(output.headers) if output.headers else None)
                break
            except asyncio.CancelledError:
                raise
            except Exception as error:
                # A transaction fenced or aborted under it: the engine's next commit sorts that out, not a retry here.
                if attempt == SEND_ATTEMPTS or isinstance(error, TRANSACTION_STATE_ERRORS):
                    raise OutputFailed(f"{output.describe()} of {output.key!r}: {describe_error(error)}") from error
                log.warning("send of %s failed (attempt %d of %d): %r", output.describe(), attempt, SEND_ATTEMPTS, error)
                await environment.current().clock.sleep(SEND_BACKOFF_S * attempt)


async def dead_letter_output(event: EventT[bytes], failure: Undeliverable, *, agent: str, step: str) -> None:
    """The dead letter of an output that cannot be written: the output (cut to fit), where it came from, why."""
    output = failure.output
    value = failure.encoded
    if value is None:
        value = repr(output.value).encode("utf-8", "backslashreplace")
    record = dead_letter_record(
        reason="undeliverable",
        error=failure.problem,
        agent=agent,
        step=step,
        attempts=1,
        topic=event.message.topic,
        partition=event.message.partition,
        offset=event.message.offset,
        key=output.key.encode() if output.key is not None else None,
        value=value,
        headers=[*message_headers(event), ("weir-destination", output.topic.get_topic_name().encode())],
    )
    await send_dead_letter_record(record)


async def send_checked(
    event: EventT[bytes], outputs: Iterable[Output], *, agent: str, step: str, all_or_none: bool = False
) -> list[Undeliverable]:
    """Send ``outputs`` after checking them (:func:`prepare_outputs`); dead-letter those that cannot be written.

    For a stage that keeps no state of its own (or whose state does not depend on what it sends): every
    output is accounted for, none can stop the worker. Returns what was dead-lettered. ``all_or_none``: when
    one output cannot be written, none is sent (the outputs only mean something together, like a barrier's
    arrival and its relays); the caller answers for the input.
    """
    prepared = prepare_outputs(outputs, record_limit())
    await dead_letter_outputs(event, prepared.undeliverable, agent=agent, step=step)
    if all_or_none and prepared.undeliverable:
        return list(prepared.undeliverable)
    await send_prepared(prepared.ready)
    metrics.outputs_sent(agent, len(prepared.ready))
    return list(prepared.undeliverable)


async def dead_letter_outputs(event: EventT[bytes], failures: Sequence[Undeliverable], *, agent: str, step: str) -> None:
    """:func:`dead_letter_output` for each output that cannot be written, each logged with its reason."""
    for failure in failures:
        log.warning("%s: an output of key %r cannot be written: %s", agent, failure.output.key, failure.problem)
        await dead_letter_output(event, failure, agent=agent, step=step)
    if failures:
        metrics.outputs_undeliverable(agent, len(failures))


class Store(Protocol[S]):
    """Where a pattern's keyed state lives: one table, or several (the aggregator keeps open and done groups apart)."""

    def load(self, key: str) -> S | None: ...

    def save(self, key: str, previous: S | None, state: S | None) -> None: ...

    def encoded_size(self, key: str, state: S) -> int:
        """The bytes the largest changelog record of ``state`` takes (what the broker must accept to store it)."""
        ...


class _Outside:
    """The scope of what runs outside any event (a test, a web view): remembered until an event's scope begins."""


_OUTSIDE = _Outside()


class TableStore(Generic[S]):
    """A state per key of one table, as the JSON its ``encode`` gives.

    Each state is encoded once and each stored value decoded once within a scope: the store remembers, per key,
    the last state it encoded or decoded and the table value that goes with it. A load whose table value is that
    very object (a scope's overlay hands back what was stored in it) returns the remembered state without
    decoding it again, and the size check and the save of one change share one encoding. States are immutable
    values (transitions return new ones), so handing the same one out twice is safe. What is remembered is
    forgotten when the scope changes (Faust's current event, the part's last): it holds no more than the scope's
    own overlay does. On a key holding many batch ids (an EOF client's totals) decoding and encoding them was
    most of the aggregator's time.
    """

    def __init__(self, table: TableT[str, Any], encode: Callable[[S], Any], decode: Callable[[Any], S]) -> None:
        self.table = table
        self.encode = encode
        self.decode = decode
        self._known: dict[str, tuple[Any, S]] = {}
        self._scope: weakref.ref[Any] | None = None

    def _memory(self) -> dict[str, tuple[Any, S]]:
        """What is remembered in the current scope (emptied when the scope changed since the last call)."""
        event = faust.current_event() or _OUTSIDE
        if self._scope is None or self._scope() is not event:
            self._known.clear()
            self._scope = weakref.ref(event)
        return self._known

    def _encoded(self, key: str, state: S) -> Any:
        memory = self._memory()
        known = memory.get(key)
        if known is not None and known[1] is state:
            return known[0]
        raw = self.encode(state)
        memory[key] = (raw, state)
        return raw

    def load(self, key: str) -> S | None:
        raw = self.table.get(key)
        if raw is None:
            return None
        memory = self._memory()
        known = memory.get(key)
        if known is not None and known[0] is raw:
            return known[1]
        state = self.decode(raw)
        memory[key] = (raw, state)
        return state

    def encoded_size(self, key: str, state: S) -> int:
        return len(dumps(self._encoded(key, state))) + len(key.encode())

    def save(self, key: str, previous: S | None, state: S | None) -> None:
        if state is None:
            if previous is not None:
                self._known.pop(key, None)
                del self.table[key]
        elif state != previous:
            self.table[key] = self._encoded(key, state)


#: What a key becomes when outputs of its change cannot be written: (key, previous state, the change, what failed) -> a new change.
UndeliverableHook = Callable[[str, Any, Change[Any], Sequence[Undeliverable]], Change[Any]]


#: What a key becomes when its new state is too large to store: (key, previous state, the change, why) -> a new change.
OversizedHook = Callable[[str, Any, Change[Any], str], Change[Any]]


def refuse_oversized(key: str, previous: Any, change: Change[Any], problem: str) -> Change[Any]:
    """The default: the input that would grow the state past a record is refused (dead-lettered); the key stays as it was."""
    return Change(state=previous, rejected=(*change.rejected, problem))


def drop_undeliverable(key: str, previous: Any, change: Change[Any], failures: Sequence[Undeliverable]) -> Change[Any]:
    """The default: the key's state as the pattern said; the outputs that cannot be written are dead-lettered only."""
    failed = {id(failure.output) for failure in failures}
    return replace(change, outputs=tuple(output for output in change.outputs if id(output) not in failed))


class KeyedState(Generic[S]):
    """The shell every stateful pattern runs through: ``load`` a key's state, ``apply`` a :class:`Change` to it."""

    def __init__(
        self,
        *,
        agent: str,
        store: Store[S],
        deadlines: DeadlineIndex | None = None,
        undeliverable: UndeliverableHook = drop_undeliverable,
        oversized: OversizedHook = refuse_oversized,
        step: str = "apply",
        deadline_kind: str = "key",
    ) -> None:
        self.agent = agent
        self.store = store
        self.deadlines = deadlines
        if deadlines is not None:
            deadlines.fatal = (*deadlines.fatal, OutputFailed)
        self.undeliverable = undeliverable
        self.oversized = oversized
        self.step = step
        self.deadline_kind = deadline_kind
        #: outputs of this worker dead-lettered as undeliverable (also in the dead-letter topic, per key)
        self.undeliverable_count = 0

    def load(self, key: str) -> S | None:
        return self.store.load(key)

    async def apply(self, event: EventT[bytes], key: str, previous: S | None, change: Change[S], *, clock_ms: int | None = None) -> None:
        """Check the outputs, then dead-letter rejects, store the state, file deadlines, send (the module's steps 1-4).

        ``clock_ms``: the time the deadlines are measured in, now (default the clock's; a window's: its stream time).
        """
        limit = record_limit()
        change = self._fit_state(key, previous, change, limit)
        prepared = prepare_outputs(change.outputs, limit)
        if prepared.undeliverable:
            await dead_letter_outputs(event, prepared.undeliverable, agent=self.agent, step=self.step)
            change = self.undeliverable(key, previous, change, prepared.undeliverable)
            # The replacement's own outputs are checked too; what still cannot be written is dead-lettered and dropped.
            again = prepare_outputs(change.outputs, limit)
            await dead_letter_outputs(event, again.undeliverable, agent=self.agent, step=self.step)
            self.undeliverable_count += len(prepared.undeliverable) + len(again.undeliverable)
            prepared = again
        for refused in change.rejected:
            if isinstance(refused, Refusal):
                reason, error = refused.reason, refused.error
                key_bytes = refused.key.encode() if refused.key is not None else None
                value = dumps(refused.value) if refused.value is not None else None
            else:
                reason, error, key_bytes, value = "rejected", refused, None, None
            await send_dead_letter(event, reason=reason, error=error, agent=self.agent, step=self.step, key=key_bytes, value=value)
            metrics.input_rejected(self.agent, reason)
        self.store.save(key, previous, change.state)
        if self.deadlines is not None:
            now = wall_clock_ms() if clock_ms is None else clock_ms
            for deadline in change.deadlines:
                kind, due_ms = deadline if isinstance(deadline, tuple) else (self.deadline_kind, deadline)
                self.deadlines.add(event.message.partition, kind, key, due_ms, now_ms=now)
        await send_prepared(prepared.ready)
        metrics.outputs_sent(self.agent, len(prepared.ready))

    def _fit_state(self, key: str, previous: S | None, change: Change[S], limit: int) -> Change[S]:
        """A new state too large for its changelog record goes to the pattern's ``oversized`` hook (checked once more)."""
        state = change.state
        if state is None or state == previous:
            return change
        size = self.store.encoded_size(key, state)
        if size <= limit:
            return change
        problem = f"{self.agent}: the state of {key!r} would be {size} bytes, more than a record may hold ({limit})"
        log.warning("%s", problem)
        replaced = self.oversized(key, previous, change, problem)
        if replaced.state is not None and replaced.state != previous and self.store.encoded_size(key, replaced.state) > limit:
            return refuse_oversized(key, previous, change, problem)
        return replaced

    async def walk_deadlines(
        self,
        event: EventT[bytes],
        now_ms: int,
        due_ms: Callable[[str, S], int | None],
        on_deadline: Callable[[str, S, int], Change[S]],
    ) -> None:
        """A tick: every key whose deadline passed gets ``on_deadline(key, state, now)`` applied, as any change.

        ``due_ms(kind, state)``: when the entry of that kind is due for that state now (None: nothing is due
        any more, the entry is dropped). A deadline that moved to a later second is filed again there; one
        later in this second waits for the next tick. The pattern's part (loading, ``on_deadline``) may fail
        for one key: that key is retried on later ticks and finally dead-lettered (``DeadlineIndex.walk``),
        and the other keys go on. A failed send (:class:`OutputFailed`) is not such a case: it stops the walk.
        """
        if self.deadlines is None:
            return
        index = self.deadlines
        partition = event.message.partition

        def deadline_of(kind: str, key: str) -> int | None:
            state = self.load(key)
            return None if state is None else due_ms(kind, state)

        async def expire(kind: str, key: str) -> None:
            state = self.load(key)
            if state is not None:
                await self.apply(event, key, state, on_deadline(key, state, now_ms), clock_ms=now_ms)

        async def give_up(kind: str, key: str, error: Exception) -> None:
            record = dead_letter_record(
                reason="error",
                error=f"{self.agent}: the deadline ({kind}) of {key!r} failed on every attempt: {describe_error(error)}",
                agent=self.agent,
                step="deadline",
                attempts=index.max_attempts,
                topic=event.message.topic,
                partition=partition,
                offset=event.message.offset,
                key=key.encode(),
                value=dumps({"kind": kind, "key": key}),
            )
            await send_dead_letter_record(record)

        await index.walk_keys(partition, now_ms, deadline_of, expire, on_give_up=give_up)
