"""One stateful stage from one key's logic: what a pattern supplies, and the one function that wires the rest.

In the spirit of Kafka Streams' ``Processor`` with its punctuator and bytewax's ``StatefulLogic``: a pattern says
which key a message is for, what each kind of message does to that key's state (a :class:`Change`: the new state,
the outputs, the refusals, the deadlines to file), what a due deadline does, and how the state is encoded.
:func:`keyed_stage` declares the rest through the wiring, the same way for a worker and for the test driver:

- the table of states (changelog-backed in a worker) and, when the logic has deadlines, its deadline index;
- the stage: each event decoded (dead-lettered alone if it cannot be), a tick walking the due deadlines, any other
  message's ``kind`` picking its transition, applied through :meth:`KeyedState.apply` (outputs checked, rejects
  dead-lettered, state stored, deadlines filed, outputs sent, all in the event's exactly-once scope);
- the ticks of its source topic, when it has deadlines.

The guarantees are :class:`app.runtime.keyed.KeyedState`'s, unchanged: this module only saves each pattern the
plumbing around them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from faust.types import EventT

from weir.app.deadlines import DeadlineIndex
from weir.app.runtime.keyed import Change, KeyedState, TableStore
from weir.app.shell import InvalidMessage, OwedOutcome, now_ms
from weir.app.stages import Stage, Wiring, per_event

__all__ = ["KeyedLogic", "Transition", "keyed_stage", "handled_event"]

_handled: contextvars.ContextVar[EventT[bytes] | None] = contextvars.ContextVar("weir_keyed_event", default=None)


def handled_event() -> EventT[bytes]:
    """The event a keyed stage is handling (a message, or the tick that walks the deadlines): for a transition whose
    outputs name where their input came from (a dead letter's topic, partition and offset)."""
    event = _handled.get()
    if event is None:
        raise RuntimeError("handled_event() is read inside a keyed stage's transition only")
    return event


S = TypeVar("S")

#: What one kind of message does to a key's state: ``(previous state or None, key, message, now_ms) -> Change``.
#: It raises :class:`app.shell.InvalidMessage` for a message it cannot take (dead-lettered, the key untouched).
Transition = Callable[[S | None, str, dict[str, Any], int], Change[S]]


@dataclass(frozen=True)
class KeyedLogic(Generic[S]):
    """A stateful stage's logic for one key at a time.

    ``name``: the agent (its dead letters, its metrics) and the stage. ``key_of(message, record_key)``: the key a
    decoded message is for, given its record's key as text (raises :class:`InvalidMessage`; it runs before the
    ``kind`` is checked). ``on_message``: a transition per value of the message's ``kind``. ``encode`` and
    ``decode``: the state as the table's JSON value. ``due_ms(kind, state)`` and ``on_deadline(key, state, now_ms)``,
    both or neither: when a key's filed deadline of a kind is due for its state now (None: nothing is due any more),
    and what it does then; a logic with them gets a deadline index and ticks.
    """

    name: str
    key_of: Callable[[Any, str], str]
    on_message: Mapping[str, Transition[S]]
    encode: Callable[[S], Any]
    decode: Callable[[Any], S]
    due_ms: Callable[[str, S], int | None] | None = None
    on_deadline: Callable[[str, S, int], Change[S]] | None = None
    #: the step its dead letters name, and the kind of a deadline filed as a bare time
    step: str = "state"
    deadline_kind: str = "key"
    #: how its errors name it ("eof controller": "eof controller: 'kind' must be ..."); default ``name``
    label: str = ""
    #: the outcome an input is owed when it could not be handled at all (:data:`app.shell.OwedOutcome`)
    owed: OwedOutcome | None = None

    def __post_init__(self) -> None:
        if (self.due_ms is None) != (self.on_deadline is None):
            raise ValueError(f"{self.name}: a keyed logic has both due_ms and on_deadline, or neither")
        if "tick" in self.on_message:
            raise ValueError(f"{self.name}: 'tick' is the runtime's kind (a due deadline), not a message's")


def keyed_stage(
    logic: KeyedLogic[S],
    wiring: Wiring,
    *,
    source: Any,
    table: tuple[str, str],
    deadlines: tuple[str, str] | None = None,
) -> tuple[Stage, KeyedState[S]]:
    """The stage that runs ``logic`` on ``source``, keeping its states in the table ``table`` (name, help text) and,
    for a logic with deadlines, their index in ``deadlines`` (name, help text). Returns the stage and its
    :class:`KeyedState` (a topology that reads a state outside the stage, a view say, reads it there)."""
    if (deadlines is None) != (logic.due_ms is None):
        raise ValueError(f"{logic.name}: a deadline index is declared for a logic with deadlines, and only for one")
    keyed: KeyedState[S] = KeyedState(
        agent=logic.name,
        store=TableStore(wiring.table(*table), logic.encode, logic.decode),
        deadlines=DeadlineIndex(wiring.table(*deadlines)) if deadlines is not None else None,
        step=logic.step,
        deadline_kind=logic.deadline_kind,
    )
    expected = ", ".join(repr(kind) for kind in logic.on_message) + (" or 'tick'" if logic.due_ms is not None else "")
    label = logic.label or logic.name

    async def handle(event: EventT[bytes], message: Any) -> None:
        token = _handled.set(event)
        try:
            await apply(event, message)
        finally:
            _handled.reset(token)

    async def apply(event: EventT[bytes], message: Any) -> None:
        now = now_ms()
        if isinstance(message, dict) and message.get("kind") == "tick":
            if logic.due_ms is not None and logic.on_deadline is not None:
                await keyed.walk_deadlines(event, now, logic.due_ms, logic.on_deadline)
            return
        key = logic.key_of(message, event.message.key.decode("utf-8", "replace") if event.message.key else "")
        kind = message.get("kind") if isinstance(message, dict) else None
        transition = logic.on_message.get(kind) if isinstance(kind, str) else None
        if transition is None:
            raise InvalidMessage(f"{label}: 'kind' must be {expected}, got {kind!r:.60}")
        previous = keyed.load(key)
        await keyed.apply(event, key, previous, transition(previous, key, message, now))

    handler = per_event(agent=logic.name, what=f"{label}: message", handler=handle, owed=logic.owed)
    ticked = (source,) if logic.due_ms is not None else ()
    return Stage(logic.name.replace(":", "-"), (source,), handler, ticked=ticked), keyed
