"""Event-time windows: the pure core of a windowed aggregation per key (Kafka Streams' ``windowedBy`` + ``aggregate``).

Time is the records' own. A partition's **stream time** is the largest timestamp it has seen; it only moves forward.
A window ``[start, start + size)`` accepts records until stream time reaches ``end + grace``: it then **closes**,
its result goes out once (``emit="final"``, Kafka Streams' ``suppress(untilWindowCloses)``), and its state goes, or,
with a retention, stays closed until stream time reaches its end plus the retention (readable, and counting what comes
late for it). A record whose window has closed when it arrives is **late**: it changes no aggregate and is counted. Hopping windows
(``advance < size``) put a record in every window that holds its timestamp; tumbling windows are hopping windows
whose advance is their size. **Session windows** (:class:`SessionSpec`) are a key's periods of activity: a record
within ``gap`` of a session joins it (several sessions it bridges merge into one); a session closes once stream
time reaches its last record plus the gap plus the grace.

The stage (:mod:`app.windows`) keeps one :class:`KeyWindows` per key, files each window's close in a deadline index
measured in stream time, and walks it as stream time moves: this module decides, the stage stores and sends.
Every function here is pure; ``now`` is always an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "WindowSpec",
    "SessionSpec",
    "KeyWindows",
    "KeySessions",
    "Accepted",
    "on_record",
    "on_close",
    "on_session_record",
    "on_session_close",
    "window_result",
    "windows_between",
]

#: ``(aggregate so far, record's value) -> aggregate``: how a window folds a record in (JSON-able aggregates).
Fold = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class WindowSpec:
    """Windows of ``size_ms`` starting every ``advance_ms`` (tumbling when equal), open for ``grace_ms`` after their end."""

    size_ms: int
    advance_ms: int
    grace_ms: int = 0
    #: how long after its end (in stream time) a window is kept, once closed too: its final aggregate stays readable
    #: (the web views) and records late for it are counted on it (Kafka Streams' window store retention). 0: a window's
    #: state goes when it closes. Otherwise at least the grace.
    retention_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.advance_ms <= 0 or self.grace_ms < 0:
            raise ValueError(f"windows: size and advance must be positive and grace not negative, got {self}")
        if self.advance_ms > self.size_ms:
            raise ValueError(f"windows: an advance ({self.advance_ms} ms) over the size ({self.size_ms} ms) leaves gaps")
        if self.retention_ms and self.retention_ms < self.grace_ms:
            raise ValueError(f"windows: a retention ({self.retention_ms} ms) shorter than the grace ({self.grace_ms} ms)")

    @classmethod
    def tumbling(cls, size_ms: int, grace_ms: int = 0, retention_ms: int = 0) -> WindowSpec:
        return cls(size_ms, size_ms, grace_ms, retention_ms)

    @classmethod
    def hopping(cls, size_ms: int, advance_ms: int, grace_ms: int = 0, retention_ms: int = 0) -> WindowSpec:
        return cls(size_ms, advance_ms, grace_ms, retention_ms)

    def expires_at(self, start: int) -> int:
        """The stream time at which a closed window kept for the retention goes."""
        return start + self.size_ms + self.retention_ms

    def starts(self, timestamp_ms: int) -> list[int]:
        """The starts of the windows that hold ``timestamp_ms``, earliest first: windows start at multiples of the advance,
        none before 0 (as in Kafka Streams)."""
        last = timestamp_ms - timestamp_ms % self.advance_ms
        first = last - ((self.size_ms - 1) // self.advance_ms) * self.advance_ms
        return [start for start in range(max(first, 0), last + 1, self.advance_ms) if start <= timestamp_ms < start + self.size_ms]

    def closes_at(self, start: int) -> int:
        """The stream time at which window ``start`` closes (its end plus the grace)."""
        return start + self.size_ms + self.grace_ms


@dataclass(frozen=True)
class KeyWindows:
    """One key's open windows: start -> (aggregate, records folded in); and, with a retention, its closed ones:
    start -> (final aggregate, records folded in, records that came late for it)."""

    open: Mapping[int, tuple[Any, int]] = field(default_factory=dict)
    closed: Mapping[int, tuple[Any, int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"open": [[start, aggregate, count] for start, (aggregate, count) in sorted(self.open.items())]}
        if self.closed:
            raw["closed"] = [[start, aggregate, count, late] for start, (aggregate, count, late) in sorted(self.closed.items())]
        return raw

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> KeyWindows:
        return cls(
            {int(start): (aggregate, int(count)) for start, aggregate, count in raw.get("open", [])},
            {int(start): (aggregate, int(count), int(late)) for start, aggregate, count, late in raw.get("closed", [])},
        )


W = TypeVar("W")


@dataclass(frozen=True)
class Accepted(Generic[W]):
    """What one record did: the new state, the windows it went into, those it came too late for, those it opened."""

    state: W | None
    into: tuple[int, ...]
    late: tuple[int, ...]
    opened: tuple[int, ...]


def on_record(
    previous: KeyWindows | None, spec: WindowSpec, timestamp_ms: int, value: Any, stream_time: int, initial: Any, fold: Fold
) -> Accepted[KeyWindows]:
    """Fold a record into each of its windows still open at ``stream_time`` (the partition's, this record included).

    A window is open while ``stream_time < end + grace``; a record for a closed one is late for it. A window this
    record is the first of is opened with ``initial``.
    """
    windows = dict(previous.open) if previous is not None else {}
    closed = dict(previous.closed) if previous is not None else {}
    into: list[int] = []
    late: list[int] = []
    opened: list[int] = []
    for start in spec.starts(timestamp_ms):
        if stream_time >= spec.closes_at(start):
            late.append(start)
            if start in closed:  # a closed window kept for its retention counts what came late for it
                final, count, late_count = closed[start]
                closed[start] = (final, count, late_count + 1)
            continue
        aggregate, count = windows.get(start, (initial, 0))
        if start not in windows:
            opened.append(start)
        windows[start] = (fold(aggregate, value), count + 1)
        into.append(start)
    changed = bool(into) or (previous is not None and closed != previous.closed)
    if not changed:
        return Accepted(previous, (), tuple(late), ())
    return Accepted(KeyWindows(windows, closed), tuple(into), tuple(late), tuple(opened))


def on_close(previous: KeyWindows, spec: WindowSpec, stream_time: int) -> tuple[KeyWindows | None, list[tuple[int, Any, int]]]:
    """Close every window whose ``end + grace`` stream time has reached: their (start, aggregate, count), earliest
    first, and the state without them (None once none is open)."""
    closed = [
        (start, aggregate, count) for start, (aggregate, count) in sorted(previous.open.items()) if stream_time >= spec.closes_at(start)
    ]
    kept = dict(previous.closed)
    if spec.retention_ms:  # kept, closed, until the window's end plus the retention
        kept.update({start: (aggregate, count, 0) for start, aggregate, count in closed if stream_time < spec.expires_at(start)})
    kept = {start: entry for start, entry in kept.items() if stream_time < spec.expires_at(start)}
    if not closed and kept == previous.closed:
        return previous, []
    left = {start: entry for start, entry in previous.open.items() if stream_time < spec.closes_at(start)}
    return (KeyWindows(left, kept) if left or kept else None), closed


def window_result(key: str, start: int, end: int, aggregate: Any, count: int, *, final: bool) -> dict[str, Any]:
    """A window's result record: its key, bounds (a session's end: its last record's time), aggregate, how many records
    it folded, and whether it is final."""
    return {"key": key, "start_ms": start, "end_ms": end, "value": aggregate, "count": count, "final": final}


#: ``(aggregate, aggregate) -> aggregate``: how two sessions a record bridges become one.
Merge = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class SessionSpec:
    """Sessions per key: records less than ``gap_ms`` apart are one session, open for ``grace_ms`` after it ends."""

    gap_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.gap_ms <= 0 or self.grace_ms < 0:
            raise ValueError(f"sessions: the gap must be positive and the grace not negative, got {self}")

    def closes_at(self, end: int) -> int:
        """The stream time at which a session whose last record is at ``end`` closes."""
        return end + self.gap_ms + self.grace_ms


@dataclass(frozen=True)
class KeySessions:
    """One key's open sessions: start -> (last record's time, aggregate, records folded in)."""

    open: Mapping[int, tuple[int, Any, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"sessions": [[start, end, aggregate, count] for start, (end, aggregate, count) in sorted(self.open.items())]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> KeySessions:
        return cls({int(start): (int(end), aggregate, int(count)) for start, end, aggregate, count in raw.get("sessions", [])})


def on_session_record(
    previous: KeySessions | None,
    spec: SessionSpec,
    timestamp_ms: int,
    value: Any,
    stream_time: int,
    initial: Any,
    fold: Fold,
    merge: Merge,
) -> Accepted[KeySessions]:
    """Fold a record into its key's session: the open sessions within the gap of it merge with it into one (its start
    the earliest, its end the latest). A record whose own session would already be closed is late; ``into`` and
    ``opened`` name the session's start (``opened``: a start no open session had)."""
    if stream_time >= spec.closes_at(timestamp_ms):
        return Accepted(previous, (), (timestamp_ms,), ())
    sessions = dict(previous.open) if previous is not None else {}
    touching = sorted(start for start, (end, _, _) in sessions.items() if start - spec.gap_ms < timestamp_ms < end + spec.gap_ms)
    start, end, aggregate, count = timestamp_ms, timestamp_ms, initial, 0
    for other in touching:
        other_end, other_aggregate, other_count = sessions.pop(other)
        aggregate = other_aggregate if count == 0 else merge(aggregate, other_aggregate)
        start, end, count = min(start, other), max(end, other_end), count + other_count
    sessions[start] = (end, fold(aggregate, value), count + 1)
    opened = () if start in touching else (start,)
    return Accepted(KeySessions(sessions), (start,), (), opened)


def on_session_close(
    previous: KeySessions, spec: SessionSpec, stream_time: int
) -> tuple[KeySessions | None, list[tuple[int, int, Any, int]]]:
    """Close every session whose last record plus gap plus grace stream time has reached: their (start, end, aggregate,
    count), earliest first, and the state without them (None once none is open)."""
    closed = [
        (start, end, aggregate, count)
        for start, (end, aggregate, count) in sorted(previous.open.items())
        if stream_time >= spec.closes_at(end)
    ]
    if not closed:
        return previous, []
    left = {start: entry for start, entry in previous.open.items() if stream_time < spec.closes_at(entry[0])}
    return (KeySessions(left) if left else None), closed


def closed_windows_of(raw: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(start, records, late records) of each closed window one key keeps for its retention (sessions keep none)."""
    if "sessions" in raw:
        return []
    return [(start, count, late) for start, (_, count, late) in sorted(KeyWindows.from_dict(raw).closed.items())]


def open_windows_of(raw: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(start, records folded in) of each open window or session of one key, whichever kind its stored value is
    (:class:`KeyWindows` or :class:`KeySessions`): what the web views and the metrics show."""
    if "sessions" in raw:
        return [(start, count) for start, (_, _, count) in sorted(KeySessions.from_dict(raw).open.items())]
    return [(start, count) for start, (_, count) in sorted(KeyWindows.from_dict(raw).open.items())]


def windows_between(raw: Mapping[str, Any], from_ms: int | None = None, to_ms: int | None = None) -> list[dict[str, Any]]:
    """One key's windows in a time range, open ones and the closed ones kept for the retention, earliest first: Kafka
    Streams' ``ReadOnlyWindowStore.fetch(key, timeFrom, timeTo)`` (windows whose start is in ``[from_ms, to_ms]``) and
    ``SessionStore.findSessions`` (sessions that overlap the range). ``None`` leaves that side open.

    Each window: ``start_ms``, ``aggregate``, ``count`` (records folded in), ``closed`` and, for a closed window,
    ``late`` (records that came after it closed); a session has ``end_ms`` (its last record) too and is always open
    (a session keeps nothing once closed).
    """
    low = from_ms if from_ms is not None else -(2**63)
    high = to_ms if to_ms is not None else 2**63 - 1
    if "sessions" in raw:
        return [
            {"start_ms": start, "end_ms": end, "aggregate": aggregate, "count": count, "closed": False}
            for start, (end, aggregate, count) in sorted(KeySessions.from_dict(raw).open.items())
            if start <= high and end >= low
        ]
    windows = KeyWindows.from_dict(raw)
    found = [
        {"start_ms": start, "aggregate": aggregate, "count": count, "closed": False}
        for start, (aggregate, count) in windows.open.items()
        if low <= start <= high
    ]
    found += [
        {"start_ms": start, "aggregate": aggregate, "count": count, "closed": True, "late": late}
        for start, (aggregate, count, late) in windows.closed.items()
        if low <= start <= high
    ]
    return sorted(found, key=lambda window: int(window["start_ms"]))
