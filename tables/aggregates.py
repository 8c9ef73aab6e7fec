"""Split/aggregate state: the typed values of the aggregator tables and their pure state core."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "DEAD_LETTERED",
    "TOO_LARGE",
    "complete_now",
    "AggregatorConfig",
    "ItemOutcome",
    "GroupState",
    "DoneState",
    "GroupTransition",
    "on_open",
    "on_item",
    "on_expire",
    "on_late_item",
    "on_force",
    "force_message",
    "complete_at_once",
    "merged_result",
]

#: The done status of a group whose result could not be written (too large, not serialisable): it is in the dead letters.
DEAD_LETTERED = "dead-lettered"
#: The completion reason of a group that grew too large to store: it completed with what it had.
TOO_LARGE = "too-large"

COMPLETE_BY_COUNT = "count"
COMPLETE_BY_FLAG = "flag"
#: Completion reasons beside count and flag: the absolute deadline passed, the group was quiet too long, an operator forced it.
TIMEOUT = "timeout"
INACTIVITY = "inactivity"
FORCED = "forced"
#: The status of a group an operator discarded: its result is sent with this status, never as complete.
DISCARDED = "discarded"
#: What an operator may do to open groups (:func:`on_force`).
FORCE_ACTIONS = ("complete", "discard")


@dataclass(frozen=True)
class AggregatorConfig:
    """How one aggregator decides that a group is complete.

    ``timeout_ms``: the absolute deadline, from the group's split (Camel's ``completionTimeout`` set once, Spring's
    ``group-timeout`` from creation); None: none. ``inactivity_ms``: complete when no outcome arrived for that
    long (Camel's ``completionTimeout``, Spring's ``group-timeout`` reset on each message, a reaper by last
    modification); None: none. Either, both (the first due wins) or neither (a group then ends only by count,
    flag or force).
    """

    name: str
    timeout_ms: int | None
    complete_by: frozenset[str] = frozenset({COMPLETE_BY_COUNT, COMPLETE_BY_FLAG})
    done_retention_ms: int = 600_000
    inactivity_ms: int | None = None

    def __post_init__(self) -> None:
        unknown = self.complete_by - {COMPLETE_BY_COUNT, COMPLETE_BY_FLAG}
        if unknown or not self.complete_by:
            message = (
                f"aggregator {self.name!r}: complete_by must be a non-empty subset of {{'count', 'flag'}}, got {sorted(self.complete_by)}"
            )
            raise ValueError(message)
        for knob in ("timeout_ms", "inactivity_ms"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                message = f"aggregator {self.name!r}: {knob} must be a positive integer or None, got {value!r}"
                raise ValueError(message)

    def deadline_from(self, now_ms: int) -> int | None:
        """The absolute deadline of a group split at ``now_ms`` (None without ``timeout_ms``)."""
        return None if self.timeout_ms is None else now_ms + self.timeout_ms


@dataclass(frozen=True)
class ItemOutcome:
    """What happened to one item: processed (ok, with its result) or failed (with its error)."""

    index: int
    ok: bool
    result: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "ok": self.ok, "result": self.result, "error": self.error}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ItemOutcome:
        return cls(index=int(raw["index"]), ok=bool(raw["ok"]), result=raw.get("result"), error=raw.get("error"))


@dataclass(frozen=True)
class GroupState:
    """An open group in table ``aggregates``: the items received so far, by index, and its deadline."""

    correlation_id: str
    #: the absolute deadline (None: the aggregator has no ``timeout_ms``)
    deadline_ms: int | None
    opened_ms: int
    expected_count: int | None = None
    #: index of the item flagged ``last``, when one arrived
    last_index: int | None = None
    received: dict[int, ItemOutcome] = field(default_factory=dict)
    #: opaque data of the open, handed back with the result (a flow's exchange, to resume it after the aggregate)
    context: Any = None
    #: when the last outcome was merged (None: none yet; the inactivity deadline then runs from ``opened_ms``)
    updated_ms: int | None = None
    #: outcomes that arrived again for an index already merged (dropped, counted)
    duplicates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "correlation_id": self.correlation_id,
            "deadline_ms": self.deadline_ms,
            "opened_ms": self.opened_ms,
            "expected_count": self.expected_count,
            "last_index": self.last_index,
            "received": [outcome.to_dict() for _, outcome in sorted(self.received.items())],
            **({"context": self.context} if self.context is not None else {}),
            **({"updated_ms": self.updated_ms} if self.updated_ms is not None else {}),
            **({"duplicates": self.duplicates} if self.duplicates else {}),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GroupState:
        outcomes = [ItemOutcome.from_dict(item) for item in raw.get("received", [])]
        return cls(
            correlation_id=str(raw["correlation_id"]),
            deadline_ms=None if raw.get("deadline_ms") is None else int(raw["deadline_ms"]),
            opened_ms=int(raw["opened_ms"]),
            expected_count=raw.get("expected_count"),
            last_index=raw.get("last_index"),
            received={outcome.index: outcome for outcome in outcomes},
            context=raw.get("context"),
            updated_ms=raw.get("updated_ms"),
            duplicates=int(raw.get("duplicates", 0)),
        )

    def inactive_ms(self, config: AggregatorConfig) -> int | None:
        """When the group has been quiet for the aggregator's ``inactivity_ms`` (None: no inactivity timeout)."""
        if config.inactivity_ms is None:
            return None
        return (self.opened_ms if self.updated_ms is None else self.updated_ms) + config.inactivity_ms

    def due_ms(self, config: AggregatorConfig) -> int | None:
        """When the group times out: the earlier of its absolute and its inactivity deadline (None: never)."""
        dues = [due for due in (self.deadline_ms, self.inactive_ms(config)) if due is not None]
        return min(dues, default=None)

    def missing_indexes(self) -> list[int]:
        upper = self.expected_count
        if upper is None:
            upper = max(self.received, default=-1) + 1
        return [index for index in range(upper) if index not in self.received]


@dataclass(frozen=True)
class DoneState:
    """A completed group in table ``aggregates_done``: remembered to count (never merge) late items."""

    correlation_id: str
    status: str
    completed_ms: int
    expires_ms: int
    late_indexes: tuple[int, ...] = ()
    #: why the result could not be written, when ``status`` is ``dead-lettered``
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "correlation_id": self.correlation_id,
            "status": self.status,
            "completed_ms": self.completed_ms,
            "expires_ms": self.expires_ms,
            "late_indexes": list(self.late_indexes),
            **({"error": self.error} if self.error is not None else {}),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DoneState:
        return cls(
            correlation_id=str(raw["correlation_id"]),
            status=str(raw["status"]),
            completed_ms=int(raw["completed_ms"]),
            expires_ms=int(raw["expires_ms"]),
            late_indexes=tuple(int(index) for index in raw.get("late_indexes", [])),
            error=raw.get("error"),
        )


@dataclass(frozen=True)
class GroupTransition:
    """The result of one event: the group's new state (None: delete the key), what to emit, what to refuse."""

    state: GroupState | None
    done: DoneState | None = None
    emits: tuple[dict[str, Any], ...] = ()
    rejected: str | None = None
    #: the completed group's context (from its open), for whoever resumes with the result
    context: Any = None


def on_open(
    state: GroupState | None,
    correlation_id: str,
    total: int | None,
    deadline_ms: int | None,
    now_ms: int,
    *,
    config: AggregatorConfig,
    context: Any = None,
) -> GroupTransition:
    """The splitter announced a group: remember its deadline, its size when completing by count, its context.

    A repeat changes nothing. A flag-only aggregator ignores the announced total: its count comes from
    the item flagged last.
    """
    counted_total = total if COMPLETE_BY_COUNT in config.complete_by else None
    if state is not None:
        updated = state
        if state.expected_count is None and counted_total is not None:
            updated = replace(updated, expected_count=counted_total, deadline_ms=deadline_ms)
        if state.context is None and context is not None:
            updated = replace(updated, context=context)
        return GroupTransition(state=updated)
    fresh = GroupState(
        correlation_id=correlation_id, deadline_ms=deadline_ms, opened_ms=now_ms, expected_count=counted_total, context=context
    )
    return GroupTransition(state=fresh)


def on_item(
    state: GroupState | None,
    config: AggregatorConfig,
    correlation_id: str,
    outcome: ItemOutcome,
    total: int | None,
    last: bool,
    now_ms: int,
) -> GroupTransition:
    """An item's outcome arrived: merge it once by index (a second one for a merged index is counted, dropped);
    complete the group when its criteria hold. A merge restarts the inactivity deadline."""
    group = state or GroupState(correlation_id=correlation_id, deadline_ms=config.deadline_from(now_ms), opened_ms=now_ms)
    counted_total = total if COMPLETE_BY_COUNT in config.complete_by else None
    problem = _check_item(group, config, outcome.index, counted_total, last)
    if problem is not None:
        return GroupTransition(state=state, rejected=problem)  # a refused item leaves no trace, not even a new group
    if outcome.index in group.received:
        return GroupTransition(state=replace(group, duplicates=group.duplicates + 1))  # merged once already
    state = group
    expected = state.expected_count
    if expected is None and counted_total is not None:
        expected = counted_total
    last_index = state.last_index
    if last:
        last_index = outcome.index
        if COMPLETE_BY_FLAG in config.complete_by:
            expected = outcome.index + 1
    received = dict(state.received)
    received[outcome.index] = outcome
    updated = replace(state, expected_count=expected, last_index=last_index, received=received, updated_ms=now_ms)
    if expected is not None and len(received) >= expected and all(index in received for index in range(expected)):
        reason = COMPLETE_BY_FLAG if last_index is not None and COMPLETE_BY_FLAG in config.complete_by else COMPLETE_BY_COUNT
        return _complete(updated, config, "complete", reason, now_ms)
    return GroupTransition(state=updated)


def complete_at_once(
    config: AggregatorConfig,
    correlation_id: str,
    total: int,
    outcomes: Sequence[tuple[ItemOutcome, bool]],
    deadline_ms: int | None,
    now_ms: int,
) -> GroupTransition:
    """A group whose every outcome is at hand (the item step ran inline): opened, merged and completed in one step.

    The transitions of the aggregate stage (:func:`on_open`, then :func:`on_item` for each outcome with its
    ``last`` flag), so its result is the one that stage would emit for these outcomes. Outcomes that do not
    complete the group (not every index of ``total``) leave it open: the transition then has no result.
    """
    state = on_open(None, correlation_id, total, deadline_ms, now_ms, config=config).state
    transition = GroupTransition(state=state)
    for outcome, last in outcomes:
        transition = on_item(state, config, correlation_id, outcome, total, last, now_ms)
        if transition.done is not None or transition.rejected is not None:
            return transition
        state = transition.state
    return transition


def on_expire(state: GroupState | None, config: AggregatorConfig, now_ms: int) -> GroupTransition:
    """A tick: a group past its deadline completes partial, naming what is missing and the deadline that came
    due first (``timeout``: the absolute one, also on a tie; ``inactivity``); others stay."""
    due = None if state is None else state.due_ms(config)
    if state is None or due is None or due > now_ms:
        return GroupTransition(state=state)
    reason = TIMEOUT if state.deadline_ms == due else INACTIVITY
    return _complete(state, config, "partial", reason, now_ms)


def on_force(state: GroupState | None, config: AggregatorConfig, action: str, now_ms: int) -> GroupTransition:
    """An operator's force on an open group (Camel's forceCompletion, Spring's ``forceComplete`` / ``expireMessageGroups``).

    ``complete``: the group completes now with what it has, reason ``forced`` (status ``complete`` when nothing
    is missing, else ``partial``). ``discard``: it ends now with status ``discarded``, reason ``forced``; its
    result still goes out with the outcomes it had, so nothing merged is lost without a trace. No open group:
    nothing changes.
    """
    if action not in FORCE_ACTIONS:
        message = f"aggregator {config.name!r}: a force action is one of {list(FORCE_ACTIONS)}, got {action!r}"
        raise ValueError(message)
    if state is None:
        return GroupTransition(state=None)
    if action == "discard":
        return _complete(state, config, DISCARDED, FORCED, now_ms)
    known = state.expected_count is not None
    status = "complete" if known and not state.missing_indexes() else "partial"
    return _complete(state, config, status, FORCED, now_ms)


def on_late_item(done: DoneState, index: int) -> DoneState:
    """An item for a completed group: counted once by index, never merged."""
    if index in done.late_indexes:
        return done
    return replace(done, late_indexes=tuple(sorted((*done.late_indexes, index))))


def force_message(action: str, correlation_id: str | None = None) -> dict[str, Any]:
    """An operator's control message to an aggregate topic: force-``complete`` or force-``discard`` one group, or
    every open group of the partition it is sent to (``correlation_id`` None: send it to every partition).

    Camel's ``forceCompletion`` signal, Spring Integration's ``forceComplete`` / ``expireMessageGroups``. The
    result says ``reason: forced``; a discarded group's result has status ``discarded``.
    """
    message: dict[str, Any] = {"kind": "force", "action": action}
    if correlation_id is not None:
        message["correlation_id"] = correlation_id
    return message


def merged_result(state: GroupState, config: AggregatorConfig, status: str, reason: str, now_ms: int) -> dict[str, Any]:
    """The aggregate a group emits: per item ok / failed (with error) / missing."""
    missing = state.missing_indexes()
    upper = max([*state.received, *missing], default=-1) + 1
    items: list[dict[str, Any]] = []
    for index in range(upper):
        outcome = state.received.get(index)
        if outcome is None:
            items.append({"index": index, "status": "missing"})
        elif outcome.ok:
            items.append({"index": index, "status": "ok", "result": outcome.result})
        else:
            items.append({"index": index, "status": "failed", "error": outcome.error})
    return {
        "correlation_id": state.correlation_id,
        "aggregator": config.name,
        "status": status,
        "reason": reason,
        "expected_count": state.expected_count,
        "items": items,
        "missing": missing,
        "failed": [index for index, outcome in sorted(state.received.items()) if not outcome.ok],
        "opened_ms": state.opened_ms,
        "deadline_ms": state.deadline_ms,
        "completed_ms": now_ms,
        "duplicates": state.duplicates,
    }


def complete_now(state: GroupState, config: AggregatorConfig, status: str, reason: str, now_ms: int) -> GroupTransition:
    """Complete a group at once with what it has (a group too large to store: ``TOO_LARGE``)."""
    return _complete(state, config, status, reason, now_ms)


def _complete(state: GroupState, config: AggregatorConfig, status: str, reason: str, now_ms: int) -> GroupTransition:
    done = DoneState(
        correlation_id=state.correlation_id,
        status=status,
        completed_ms=now_ms,
        expires_ms=now_ms + config.done_retention_ms,
    )
    return GroupTransition(state=None, done=done, emits=(merged_result(state, config, status, reason, now_ms),), context=state.context)


def _check_item(state: GroupState, config: AggregatorConfig, index: int, total: int | None, last: bool) -> str | None:
    where = f"aggregator {config.name!r}: item {index} of group {state.correlation_id!r}"
    if index < 0:
        return f"{where} has a negative index"
    if total is not None and total <= 0:
        return f"{where} has total {total}, but a group has at least one item"
    if total is not None and state.expected_count is not None and total != state.expected_count:
        return f"{where} has total {total}, but the group expects {state.expected_count}"
    expected = state.expected_count if state.expected_count is not None else total
    if expected is not None and index >= expected:
        return f"{where} is out of range: the group expects {expected} items (indexes 0..{expected - 1})"
    if last and state.last_index is not None and state.last_index != index:
        return f"{where} is flagged last, but item {state.last_index} was already flagged last"
    if last and COMPLETE_BY_FLAG in config.complete_by:
        beyond = [received for received in state.received if received > index]
        if beyond:
            return f"{where} is flagged last, but items {beyond} with higher indexes already arrived"
    return None
