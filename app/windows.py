"""Windowed aggregations on event time: a declaration (:class:`Window`) and its stage on the keyed runtime.

A window reads ``source``, keyed like the topic (the record's key), and folds each record's value into every
window of its key that holds the record's timestamp (:mod:`tables.windows`). Each partition's stream time is the
largest timestamp it has read (table ``window-<name>-time``); a window closes once stream time reaches its end plus
the grace, and its result goes to ``to`` then, once, in the transaction that closes it (``emit="final"``), or on
every record and at close (``emit="update"``). A record too late for all its windows changes nothing and is
dead-lettered with reason ``late``. Closing is driven by the records themselves, as in Kafka Streams: a partition
that reads nothing more closes nothing more.

Each window's close is filed when it opens in a deadline index measured in stream time (``window-<name>-closes``),
walked after each record up to the partition's stream time: closing a window touches only the keys it closes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from faust.types import EventT

from weir.app.deadlines import DeadlineIndex
from weir.app.runtime.keyed import Change, KeyedState, Output, Refusal, TableStore
from weir.app.settings import load_declarations
from weir.app.shell import InvalidMessage
from weir.app.stages import Stage, Wiring, per_event
from weir.tables.windows import (
    Fold,
    KeySessions,
    KeyWindows,
    Merge,
    SessionSpec,
    WindowSpec,
    on_close,
    on_record,
    on_session_close,
    on_session_record,
    window_result,
)

__all__ = ["Window", "WindowTopology", "count", "load_windows", "total"]

W = TypeVar("W")

#: How far (seconds of stream time) one record's walk of the closes goes at most.
MAX_JUMP_S = 7 * 24 * 3600


def count(aggregate: Any, _value: Any) -> Any:
    """Fold: how many records (``initial=0``)."""
    return aggregate + 1


def total(field: str) -> Fold:
    """Fold: the sum of a numeric field of each record's value (``initial=0``)."""

    def add(aggregate: Any, value: Any) -> Any:
        number = value.get(field) if isinstance(value, dict) else None
        if not isinstance(number, int | float) or isinstance(number, bool):
            raise InvalidMessage(f"window: a record needs a number {field!r}, got {number!r:.60}")
        return aggregate + number

    return add


@dataclass(frozen=True)
class Window:
    """A windowed aggregation: ``source`` -> per key and window, ``fold`` from ``initial`` -> ``to``.

    ``spec``: :meth:`WindowSpec.tumbling` or :meth:`WindowSpec.hopping` (size, advance, grace, in ms), or a
    :class:`SessionSpec` (gap, grace): a key's sessions, two of which a record bridges merging with ``merge``
    (default: ``+``, right for ``count`` and ``total``).
    ``timestamp``: the event time of a record's value (ms); None: the record's own timestamp.
    ``emit``: ``"final"``, one result per window when it closes; ``"update"``, a result on every record it takes and
    the final one at close. Results: ``{"key", "start_ms", "end_ms", "value", "count", "final"}``, keyed by the key.
    """

    name: str
    source: str
    to: str
    spec: WindowSpec | SessionSpec
    initial: Any = 0
    fold: Fold = count
    timestamp: Callable[[Any], int] | None = None
    emit: Literal["final", "update"] = "final"
    merge: Merge = operator.add

    def __post_init__(self) -> None:
        if not self.name or not all(char.isalnum() or char in "_-" for char in self.name):
            raise ValueError(f"window {self.name!r}: a name holds letters, digits, '_' and '-'")
        if self.emit not in ("final", "update"):
            raise ValueError(f"window {self.name!r}: emit is 'final' or 'update', got {self.emit!r}")


def load_windows(module_names: str) -> list[Window]:
    """The ``WINDOWS`` lists of the modules ``module_names`` names (``WEIR_WINDOWS``: one module, or several comma separated)."""
    windows: list[Window] = load_declarations("WEIR_WINDOWS", module_names, "WINDOWS", Window, "windows")
    return windows


#: What a window's result becomes: ``(window, key, result) -> Output``.
ResultOutput = Callable[["Window", str, dict[str, Any]], Output]


class WindowTopology:
    """The stages of some windows: one per window, each with its three tables."""

    def __init__(self, windows: Sequence[Window], wiring: Wiring, *, results: ResultOutput | None = None) -> None:
        names = [window.name for window in windows]
        if len(set(names)) != len(names):
            raise ValueError(f"windows: names must differ, got {names}")
        self.windows = list(windows)
        self._wiring = wiring
        #: what a window's result becomes (a flow's window step: the resume of its flow); default: the result record
        self._results = results

    def stages(self) -> list[Stage]:
        return [self.window_stage(window) for window in self.windows]

    def _result(self, window: Window, to: Any, key: str, value: dict[str, Any]) -> Output:
        if self._results is not None:
            return self._results(window, key, value)
        return Output(to, key, value, what=f"window {window.name} result")

    def _declare(self, window: Window, noun: str) -> tuple[str, Any, Any, Any]:
        """A window's agent name, its source and result topics, and its table of stream time per partition."""
        agent = f"window-{window.name}"
        help_text = f"{noun.capitalize()}s {window.name!r}: each partition's stream time (ms), the largest timestamp read."
        wiring = self._wiring
        return agent, wiring.topic_named(window.source), wiring.topic_named(window.to), wiring.table(f"{agent}-time", help_text)

    def _keyed_state(
        self, window: Window, noun: str, contents: str, encode: Callable[[W], Any], decode: Callable[[Any], W]
    ) -> KeyedState[W]:
        """A window's states per key (table ``window-<name>``) and the index of their closes in stream time."""
        agent = f"window-{window.name}"
        what = f"{noun.capitalize()}s {window.name!r}"
        closes = DeadlineIndex(self._wiring.table(f"{agent}-closes", f"{what}: when each {noun} closes, in stream time."))
        # Stream time may jump (a producer's clock, a gap in the data) and only a record moves it: one walk goes as far as
        # a week (a walk steps through each second it passes), a larger jump closes the rest on the next records.
        closes.max_seconds_per_walk = MAX_JUMP_S
        store = TableStore(self._wiring.table(agent, f"{what}: {contents}."), encode, decode)
        return KeyedState(agent=agent, store=store, deadlines=closes, step="window")

    def window_stage(self, window: Window) -> Stage:
        if isinstance(window.spec, SessionSpec):
            return self._session_stage(window, window.spec)
        spec = window.spec
        agent, source, to, times = self._declare(window, "window")
        keyed = self._keyed_state(
            window,
            "window",
            "each key's open windows, start -> [aggregate, records] (tables.windows)",
            KeyWindows.to_dict,
            KeyWindows.from_dict,
        )

        def result(key: str, start: int, aggregate: Any, records: int, *, final: bool) -> Output:
            return self._result(window, to, key, window_result(key, start, start + spec.size_ms, aggregate, records, final=final))

        def due(kind: str, state: KeyWindows) -> int | None:
            """A window's close, filed as kind ``w<start>``: due while it is open (closed by an earlier walk: nothing);
            with a retention, a closed window's end, filed as ``r<start>``: due while it is kept."""
            start = int(kind[1:])
            if kind[0] == "r":
                return spec.expires_at(start) if start in state.closed else None
            return spec.closes_at(start) if start in state.open else None

        def close(key: str, state: KeyWindows, stream_time: int) -> Change[KeyWindows]:
            left, closed = on_close(state, spec, stream_time)
            kept = left.closed if left is not None else {}
            expiries = tuple((f"r{start}", spec.expires_at(start)) for start, _, _ in closed if start in kept)
            outputs = tuple(result(key, start, value, records, final=True) for start, value, records in closed)
            return Change(state=left, outputs=outputs, deadlines=expiries)

        async def handle(event: EventT[bytes], message: Any) -> None:
            key, stamp, stream_time = _event_time(window, times, event, message)
            previous = keyed.load(key)
            accepted = on_record(previous, spec, stamp, message, stream_time, window.initial, window.fold)
            outputs: tuple[Output, ...] = ()
            if window.emit == "update" and accepted.state is not None:
                outputs = tuple(result(key, start, *accepted.state.open[start], final=False) for start in accepted.into)
            rejected: tuple[Refusal, ...] = ()
            if accepted.late and not accepted.into:
                late = f"window {window.name}: record at {stamp} ms is late for {list(accepted.late)} (stream time {stream_time} ms)"
                rejected = (Refusal("late", late),)
            filed = tuple((f"w{start}", spec.closes_at(start)) for start in accepted.opened)
            change = Change(state=accepted.state, outputs=outputs, rejected=rejected, deadlines=filed)
            await keyed.apply(event, key, previous, change, clock_ms=stream_time)
            await keyed.walk_deadlines(event, stream_time, due, close)

        handler = per_event(agent=agent, what=f"window {window.name}: record", handler=handle)
        return Stage(agent, (source,), handler)

    def _session_stage(self, window: Window, spec: SessionSpec) -> Stage:
        """Sessions: the same tables and walk as windows, each session's close filed under its start (``w<start>``)
        and moved later as records extend it; a session merged into another leaves its entry to be dropped."""
        agent, source, to, times = self._declare(window, "session")
        keyed = self._keyed_state(
            window, "session", "each key's open sessions, start -> [end, aggregate, records]", KeySessions.to_dict, KeySessions.from_dict
        )

        def result(key: str, start: int, end: int, aggregate: Any, records: int, *, final: bool) -> Output:
            return self._result(window, to, key, window_result(key, start, end, aggregate, records, final=final))

        def due(kind: str, state: KeySessions) -> int | None:
            session = state.open.get(int(kind[1:]))
            return None if session is None else spec.closes_at(session[0])

        def close(key: str, state: KeySessions, stream_time: int) -> Change[KeySessions]:
            left, closed = on_session_close(state, spec, stream_time)
            outputs = tuple(result(key, start, end, value, records, final=True) for start, end, value, records in closed)
            return Change(state=left, outputs=outputs)

        async def handle(event: EventT[bytes], message: Any) -> None:
            key, stamp, stream_time = _event_time(window, times, event, message)
            previous = keyed.load(key)
            accepted = on_session_record(previous, spec, stamp, message, stream_time, window.initial, window.fold, window.merge)
            outputs: tuple[Output, ...] = ()
            if window.emit == "update" and accepted.state is not None:
                outputs = tuple(result(key, start, *accepted.state.open[start], final=False) for start in accepted.into)
            rejected: tuple[Refusal, ...] = ()
            if accepted.late:
                late = f"window {window.name}: record at {stamp} ms is late for its session (stream time {stream_time} ms)"
                rejected = (Refusal("late", late),)
            sessions = accepted.state.open if accepted.state is not None else {}
            filed = tuple((f"w{start}", spec.closes_at(sessions[start][0])) for start in accepted.opened)
            change = Change(state=accepted.state, outputs=outputs, rejected=rejected, deadlines=filed)
            await keyed.apply(event, key, previous, change, clock_ms=stream_time)
            await keyed.walk_deadlines(event, stream_time, due, close)

        handler = per_event(agent=agent, what=f"window {window.name}: record", handler=handle)
        return Stage(agent, (source,), handler)


def _event_time(window: Window, times: Any, event: EventT[bytes], message: Any) -> tuple[str, int, int]:
    """A record's key, its event time, and its partition's stream time with it (stored when it moved)."""
    key = event.message.key.decode("utf-8", "replace") if event.message.key is not None else ""
    stamp = window.timestamp(message) if window.timestamp is not None else round(event.message.timestamp * 1000)
    if not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
        raise InvalidMessage(f"window {window.name}: a record's timestamp must be a non-negative integer (ms), got {stamp!r:.60}")
    slot = str(event.message.partition)
    stream_time = max(times.get(slot, -1), stamp)
    if stream_time != times.get(slot):
        times[slot] = stream_time
    return key, stamp, stream_time
