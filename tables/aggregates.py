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
    "complete_at_once",
    "merged_result",
]

#: The done status of a group whose result could not be written (too large, not serialisable): it is in the dead letters.
DEAD_LETTERED = "dead-lettered"
#: The completion reason of a group that grew too large to store: it completed with what it had.
TOO_LARGE = "too-large"

COMPLETE_BY_COUNT = "count"
COMPLETE_BY_FLAG = "flag"


@dataclass(frozen=True)
class AggregatorConfig:
    """How one aggregator decides that a group is complete."""

    name: str
    timeout_ms: int
    complete_by: frozenset[str] = frozenset({COMPLETE_BY_COUNT, COMPLETE_BY_FLAG})
    done_retention_ms: int = 600_000

    def __post_init__(self) -> None:
        unknown = self.complete_by - {COMPLETE_BY_COUNT, COMPLETE_BY_FLAG}
        if unknown or not self.complete_by:
            message = (
                f"aggregator {self.name!r}: complete_by must be a non-empty subset of {{'count', 'flag'}}, got {sorted(self.complete_by)}"
            )
            raise ValueError(message)
        if self.timeout_ms <= 0:
            message = f"aggregator {self.name!r}: timeout_ms must be positive, got {self.timeout_ms}"
            raise ValueError(message)


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
    deadline_ms: int
    opened_ms: int
    expected_count: int | None = None
    #: index of the item flagged ``last``, when one arrived
    last_index: int | None = None
    received: dict[int, ItemOutcome] = field(default_factory=dict)
    #: opaque data of the open, handed back with the result (a flow's exchange, to resume it after the aggregate)
    context: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "correlation_id": self.correlation_id,
            "deadline_ms": self.deadline_ms,
            "opened_ms": self.opened_ms,
            "expected_count": self.expected_count,
            "last_index": self.last_index,
            "received": [outcome.to_dict() for _, outcome in sorted(self.received.items())],
            **({"context": self.context} if self.context is not None else {}),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GroupState:
        outcomes = [ItemOutcome.from_dict(item) for item in raw.get("received", [])]
        return cls(
            correlation_id=str(raw["correlation_id"]),
            deadline_ms=int(raw["deadline_ms"]),
            opened_ms=int(raw["opened_ms"]),
            expected_count=raw.get("expected_count"),
            last_index=raw.get("last_index"),
            received={outcome.index: outcome for outcome in outcomes},
            context=raw.get("context"),
        )

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
    deadline_ms: int,
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
    """An item's outcome arrived: merge it once by index; complete the group when its criteria hold."""
    group = state or GroupState(correlation_id=correlation_id, deadline_ms=now_ms + config.timeout_ms, opened_ms=now_ms)
    counted_total = total if COMPLETE_BY_COUNT in config.complete_by else None
    problem = _check_item(group, config, outcome.index, counted_total, last)
    if problem is not None:
        return GroupTransition(state=state, rejected=problem)  # a refused item leaves no trace, not even a new group
    if outcome.index in group.received:
        return GroupTransition(state=state)  # redelivered: merged once already
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
    updated = replace(state, expected_count=expected, last_index=last_index, received=received)
    if expected is not None and len(received) >= expected and all(index in received for index in range(expected)):
        reason = COMPLETE_BY_FLAG if last_index is not None and COMPLETE_BY_FLAG in config.complete_by else COMPLETE_BY_COUNT
        return _complete(updated, config, "complete", reason, now_ms)
    return GroupTransition(state=updated)


def complete_at_once(
    config: AggregatorConfig,
    correlation_id: str,
    total: int,
    outcomes: Sequence[tuple[ItemOutcome, bool]],
    deadline_ms: int,
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
    """A tick: a group past its deadline completes partial, naming what is missing; others stay."""
    if state is None or state.deadline_ms > now_ms:
        return GroupTransition(state=state)
    return _complete(state, config, "partial", "timeout", now_ms)


def on_late_item(done: DoneState, index: int) -> DoneState:
    """An item for a completed group: counted once by index, never merged."""
    if index in done.late_indexes:
        return done
    return replace(done, late_indexes=tuple(sorted((*done.late_indexes, index))))


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
