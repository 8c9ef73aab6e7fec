"""Split/aggregate state: the typed values of the aggregator tables and their pure state core."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    "on_items",
    "on_expire",
    "on_late_item",
    "on_force",
    "on_part",
    "Part",
    "ONE_SHOT",
    "REOPENING",
    "INTERVAL",
    "NEW_GROUP",
    "BATCH_END",
    "on_new_group",
    "CONTINUE_ON_FAILURE",
    "STOP_ON_FAILURE",
    "ITEM_FAILURE_RULES",
    "ITEM_FAILED",
    "FAILED_STATUS",
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
#: Completed by the aggregator's period (``complete_interval_ms``: Camel's ``completionInterval``).
INTERVAL = "interval"
#: Completed because a part of another key opened a group in its partition (``complete_on_new_group``: Camel's
#: ``completionOnNewCorrelationGroup``).
NEW_GROUP = "new-group"
#: Completed at the end of the batch its parts came in (``complete_at_batch_end``: Camel's ``completionFromBatchConsumer``).
BATCH_END = "batch-end"
#: The status of a group an operator discarded: its result is sent with this status, never as complete.
DISCARDED = "discarded"
#: What an operator may do to open groups (:func:`on_force`).
FORCE_ACTIONS = ("complete", "discard")
#: Completion reasons of correlation groups (:func:`on_part`): so many parts arrived; the user's predicate said so.
COMPLETE_BY_SIZE = "size"
COMPLETE_BY_PREDICATE = "predicate"
#: What a correlation group's key does after it completed: late parts are counted (one-shot), or the next part
#: opens the key's next group at once (reopening: "batch every 3 messages per customer").
ONE_SHOT = "one-shot"
REOPENING = "reopening"
#: What a split's group does when an item's outcome is a failure (its step's retries spent): merge it and wait for the
#: others (``continue``), or end now with status ``failed`` naming that item and its cause (``stop``: Camel's
#: ``stopOnException``). The reason of such a completion, and its status.
CONTINUE_ON_FAILURE = "continue"
STOP_ON_FAILURE = "stop"
ITEM_FAILURE_RULES = (CONTINUE_ON_FAILURE, STOP_ON_FAILURE)
ITEM_FAILED = "item-failed"
FAILED_STATUS = "failed"


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
    #: correlation groups (:func:`on_part`, parts without indexes): one-shot or reopening keys
    groups: str = ONE_SHOT
    #: correlation groups: complete once this many parts arrived (Camel's ``completionSize``)
    complete_size: int | None = None
    #: correlation groups: complete once ``complete_when(payloads so far)`` is true (Camel's ``completionPredicate``)
    complete_when: Callable[[list[Any]], bool] | None = None
    #: split groups: an item that failed ends the group ("stop") or is merged with the others ("continue")
    on_item_failure: str = CONTINUE_ON_FAILURE
    #: every open group completes at each multiple of this period on the clock (Camel's ``completionInterval``:
    #: all open groups at once, not per group); None: no period
    complete_interval_ms: int | None = None
    #: correlation groups: a part that opens a group completes the group open in its partition (Camel's
    #: ``completionOnNewCorrelationGroup``: one group in progress at a time, per partition)
    complete_on_new_group: bool = False
    #: correlation groups: every group a batch brought parts to completes at the batch's end (Camel's
    #: ``completionFromBatchConsumer``; a batch: the records of one partition its consumer had ready)
    complete_at_batch_end: bool = False
    #: split groups: a group still missing items this long after it opened asks for them again (the open carries the
    #: items' payloads), then again after as long, ``rerequests`` times at most, before its timeout; None: never
    rerequest_after_ms: int | None = None
    rerequests: int = 0

    def __post_init__(self) -> None:
        unknown = self.complete_by - {COMPLETE_BY_COUNT, COMPLETE_BY_FLAG}
        if unknown or not self.complete_by:
            message = (
                f"aggregator {self.name!r}: complete_by must be a non-empty subset of {{'count', 'flag'}}, got {sorted(self.complete_by)}"
            )
            raise ValueError(message)
        if self.on_item_failure not in ITEM_FAILURE_RULES:
            message = f"aggregator {self.name!r}: on_item_failure must be one of {list(ITEM_FAILURE_RULES)}, got {self.on_item_failure!r}"
            raise ValueError(message)
        if self.groups not in (ONE_SHOT, REOPENING):
            message = f"aggregator {self.name!r}: groups must be {ONE_SHOT!r} or {REOPENING!r}, got {self.groups!r}"
            raise ValueError(message)
        for knob in ("timeout_ms", "inactivity_ms", "complete_size", "complete_interval_ms"):
            value = getattr(self, knob)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                message = f"aggregator {self.name!r}: {knob} must be a positive integer or None, got {value!r}"
                raise ValueError(message)

    def deadline_from(self, now_ms: int) -> int | None:
        """The absolute deadline of a group split at ``now_ms`` (None without ``timeout_ms``)."""
        return None if self.timeout_ms is None else now_ms + self.timeout_ms


@dataclass(slots=True)
class ItemOutcome:
    """What happened to one item: processed (ok, with its result) or failed (with its error).

    This and the group's states and transitions are slotted, not frozen: nothing changes one once made (the core
    makes new ones, ``dataclasses.replace``), and a frozen dataclass's ``__init__`` (``object.__setattr__`` per field)
    took three times as long, ten outcomes and a few states per order (see ``app.errors.StepOutcome``).
    """

    index: int
    ok: bool
    result: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "ok": self.ok, "result": self.result, "error": self.error}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ItemOutcome:
        return cls(index=int(raw["index"]), ok=bool(raw["ok"]), result=raw.get("result"), error=raw.get("error"))


@dataclass(slots=True)
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
    #: a correlation group's number among its key's groups (reopening keys: 0, 1, 2, ...)
    sequence: int = 0
    #: a correlation group's last merged part: (partition, offset, position in its record); None for a split's group
    position: tuple[int, ...] | None = None
    #: a split's group: the input it was split from (its record, or its execution); another input reusing the group's
    #: id has another origin (None: not known, a group opened before origins were kept)
    origin: str | None = None
    #: a split's group whose aggregator re-requests missing items: every item's payload, by index (from its open)
    payloads: tuple[Any, ...] | None = None
    #: how many times its missing items were asked for again
    rerequested: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"payloads": list(self.payloads)} if self.payloads is not None else {}),
            **({"rerequested": self.rerequested} if self.rerequested else {}),
            **({"sequence": self.sequence, "position": list(self.position)} if self.position is not None else {}),
            **({"origin": self.origin} if self.origin is not None else {}),
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
            sequence=int(raw.get("sequence", 0)),
            position=None if raw.get("position") is None else tuple(int(part) for part in raw["position"]),
            origin=raw.get("origin"),
            payloads=None if raw.get("payloads") is None else tuple(raw["payloads"]),
            rerequested=int(raw.get("rerequested", 0)),
        )

    def rerequest_ms(self, config: AggregatorConfig) -> int | None:
        """When the group asks for its missing items again (None: never: no payloads, or no asks left)."""
        if config.rerequest_after_ms is None or self.payloads is None or self.rerequested >= config.rerequests:
            return None
        return self.opened_ms + config.rerequest_after_ms * (self.rerequested + 1)

    def inactive_ms(self, config: AggregatorConfig) -> int | None:
        """When the group has been quiet for the aggregator's ``inactivity_ms`` (None: no inactivity timeout)."""
        if config.inactivity_ms is None:
            return None
        return (self.opened_ms if self.updated_ms is None else self.updated_ms) + config.inactivity_ms

    def interval_ms(self, config: AggregatorConfig) -> int | None:
        """The end of the aggregator's period the group opened in (None: no ``complete_interval_ms``)."""
        period = config.complete_interval_ms
        return None if period is None else (self.opened_ms // period + 1) * period

    def due_ms(self, config: AggregatorConfig) -> int | None:
        """When the group completes by time: the earliest of its absolute deadline, its inactivity deadline and the end
        of its period (None: never)."""
        dues = [due for due in (self.deadline_ms, self.inactive_ms(config), self.interval_ms(config)) if due is not None]
        rerequest = self.rerequest_ms(config)
        if rerequest is not None and (not dues or rerequest < min(dues)):  # asking again is worth it before a deadline only
            dues.append(rerequest)
        return min(dues, default=None)

    def missing_indexes(self) -> list[int]:
        upper = self.expected_count
        if upper is None:
            upper = max(self.received, default=-1) + 1
        return [index for index in range(upper) if index not in self.received]


@dataclass(slots=True)
class DoneState:
    """A completed group in table ``aggregates_done``: remembered to count (never merge) late items."""

    correlation_id: str
    status: str
    completed_ms: int
    expires_ms: int
    late_indexes: tuple[int, ...] = ()
    #: why the result is not whole: it could not be written (``status`` is ``dead-lettered``), or the group outgrew a
    #: record and completed with what it had (``too-large: ...``); its late items are then dead-lettered, not only counted
    error: str | None = None
    #: a correlation group's number, last merged part, and parts that came after it completed (one-shot keys)
    sequence: int = 0
    position: tuple[int, ...] | None = None
    late_parts: int = 0
    #: the input the group was split from (:attr:`GroupState.origin`)
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"origin": self.origin} if self.origin is not None else {}),
            "correlation_id": self.correlation_id,
            "status": self.status,
            "completed_ms": self.completed_ms,
            "expires_ms": self.expires_ms,
            "late_indexes": list(self.late_indexes),
            **({"error": self.error} if self.error is not None else {}),
            **({"sequence": self.sequence, "position": list(self.position)} if self.position is not None else {}),
            **({"late_parts": self.late_parts} if self.late_parts else {}),
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
            sequence=int(raw.get("sequence", 0)),
            position=None if raw.get("position") is None else tuple(int(part) for part in raw["position"]),
            late_parts=int(raw.get("late_parts", 0)),
            origin=raw.get("origin"),
        )


@dataclass(slots=True)
class GroupTransition:
    """The result of one event: the group's new state (None: delete the key), what to emit, what to refuse."""

    state: GroupState | None
    done: DoneState | None = None
    emits: tuple[dict[str, Any], ...] = ()
    rejected: str | None = None
    #: the completed group's context (from its open), for whoever resumes with the result
    context: Any = None
    #: indexes of the items to ask for again (the aggregator's re-request: their payloads are in the state)
    rerequest: tuple[int, ...] = ()


def on_open(
    state: GroupState | None,
    correlation_id: str,
    total: int | None,
    deadline_ms: int | None,
    now_ms: int,
    *,
    config: AggregatorConfig,
    context: Any = None,
    origin: str | None = None,
    payloads: Sequence[Any] | None = None,
) -> GroupTransition:
    """The splitter announced a group: remember its deadline, its size when completing by count, its context and the
    input it was split from (``origin``); its items' ``payloads`` when the aggregator re-requests missing items.

    A repeat changes nothing. A flag-only aggregator ignores the announced total: its count comes from
    the item flagged last.
    """
    counted_total = total if COMPLETE_BY_COUNT in config.complete_by else None
    kept = tuple(payloads) if payloads is not None and config.rerequest_after_ms is not None and counted_total == len(payloads) else None
    if state is not None:
        updated = state
        if state.expected_count is None and counted_total is not None:
            updated = replace(updated, expected_count=counted_total, deadline_ms=deadline_ms)
        if state.context is None and context is not None:
            updated = replace(updated, context=context)
        if state.origin is None and origin is not None:
            updated = replace(updated, origin=origin)
        if state.payloads is None and kept is not None:
            updated = replace(updated, payloads=kept)
        return GroupTransition(state=updated)
    fresh = GroupState(
        correlation_id=correlation_id,
        deadline_ms=deadline_ms,
        opened_ms=now_ms,
        expected_count=counted_total,
        context=context,
        origin=origin,
        payloads=kept,
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
    if not outcome.ok and config.on_item_failure == STOP_ON_FAILURE:
        return _stopped(updated, config, outcome, now_ms)
    if expected is not None and len(received) >= expected and all(index in received for index in range(expected)):
        reason = COMPLETE_BY_FLAG if last_index is not None and COMPLETE_BY_FLAG in config.complete_by else COMPLETE_BY_COUNT
        return _complete(updated, config, "complete", reason, now_ms)
    return GroupTransition(state=updated)


def on_items(
    state: GroupState | None,
    config: AggregatorConfig,
    correlation_id: str,
    outcomes: Sequence[tuple[ItemOutcome, bool]],
    total: int | None,
    now_ms: int,
) -> tuple[GroupTransition, tuple[str, ...], int]:
    """:func:`on_item` on each of ``outcomes`` (with its ``last`` flag) in order, in one step: the group is copied
    once, not once per outcome (the fold's copies were a fifth of an inline splitter's time).

    Returns the transition (``done`` when an outcome completed the group), the problems of the outcomes refused
    (each leaves the group as it was; a refused outcome of no group makes none), and how many outcomes were
    taken: those after the one that completed the group were not (the caller counts them late). The same as
    folding :func:`on_item`, by a property test.
    """
    counted_total = total if COMPLETE_BY_COUNT in config.complete_by else None
    group = state
    expected = None if state is None else state.expected_count
    last_index = None if state is None else state.last_index
    duplicates = 0 if state is None else state.duplicates
    received: dict[int, ItemOutcome] | None = None  # the group's outcomes, copied at the first merge
    rejected: list[str] = []
    touched = merged = False
    for position, (outcome, last) in enumerate(outcomes):
        index = outcome.index
        current: Mapping[int, ItemOutcome] = received if received is not None else {} if group is None else group.received
        problem = _item_problem(
            correlation_id if group is None else group.correlation_id, expected, last_index, current, config, index, counted_total, last
        )
        if problem is not None:
            rejected.append(problem)
            continue
        touched = True
        if group is None:
            group = GroupState(correlation_id=correlation_id, deadline_ms=config.deadline_from(now_ms), opened_ms=now_ms)
        if index in current:
            duplicates += 1  # merged once already
            continue
        if expected is None and counted_total is not None:
            expected = counted_total
        if last:
            last_index = index
            if COMPLETE_BY_FLAG in config.complete_by:
                expected = index + 1
        if received is None:
            received = dict(current)
        received[index] = outcome
        merged = True
        if not outcome.ok and config.on_item_failure == STOP_ON_FAILURE:
            updated = replace(
                group, expected_count=expected, last_index=last_index, received=received, updated_ms=now_ms, duplicates=duplicates
            )
            return _stopped(updated, config, outcome, now_ms), tuple(rejected), position + 1
        if expected is not None and len(received) >= expected and all(number in received for number in range(expected)):
            updated = replace(
                group, expected_count=expected, last_index=last_index, received=received, updated_ms=now_ms, duplicates=duplicates
            )
            reason = COMPLETE_BY_FLAG if last_index is not None and COMPLETE_BY_FLAG in config.complete_by else COMPLETE_BY_COUNT
            return _complete(updated, config, "complete", reason, now_ms), tuple(rejected), position + 1
    if not touched or group is None:
        return GroupTransition(state=state), tuple(rejected), len(outcomes)
    if merged:
        group = replace(
            group, expected_count=expected, last_index=last_index, received=received or {}, updated_ms=now_ms, duplicates=duplicates
        )
    else:
        group = replace(group, duplicates=duplicates)
    return GroupTransition(state=group), tuple(rejected), len(outcomes)


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
    transition, rejected, _ = on_items(state, config, correlation_id, outcomes, total, now_ms)
    return replace(transition, rejected=rejected[0]) if rejected and transition.done is None else transition


def inline_result(
    config: AggregatorConfig,
    correlation_id: str,
    outcomes: Sequence[tuple[bool, Any, str | None]],
    deadline_ms: int | None,
    now_ms: int,
) -> dict[str, Any]:
    """:func:`complete_at_once`'s result for the outcomes (ok, result, error) of items 0..n-1 in order, the last
    flagged last: what the items-inline splitter sends for every order, built in one pass.

    Those outcomes always complete the group, by flag when the aggregator completes by flag, else by count,
    with nothing missing and nothing merged twice; going through the stage's transitions to get there (a
    group opened, copied and checked item by item) was a fifth of an inline splitter's time. The same result
    as :func:`complete_at_once`, by a property test.
    """
    if not outcomes:
        raise ValueError(f"aggregator {config.name!r}: group {correlation_id!r} has no items")
    items: list[dict[str, Any]] = []
    failed: list[int] = []
    for index, (ok, result, error) in enumerate(outcomes):
        if ok:
            items.append({"index": index, "status": "ok", "result": result})
        else:
            items.append({"index": index, "status": "failed", "error": error})
            failed.append(index)
    return {
        "correlation_id": correlation_id,
        "aggregator": config.name,
        "status": "complete",
        "reason": COMPLETE_BY_FLAG if COMPLETE_BY_FLAG in config.complete_by else COMPLETE_BY_COUNT,
        "expected_count": len(outcomes),
        "items": items,
        "missing": [],
        "failed": failed,
        "opened_ms": now_ms,
        "deadline_ms": deadline_ms,
        "completed_ms": now_ms,
        "duplicates": 0,
    }


def on_expire(state: GroupState | None, config: AggregatorConfig, now_ms: int) -> GroupTransition:
    """A tick: a group past its deadline completes partial, naming what is missing and the deadline that came
    due first (``timeout``: the absolute one, also on a tie; ``inactivity``); others stay."""
    due = None if state is None else state.due_ms(config)
    if state is None or due is None or due > now_ms:
        return GroupTransition(state=state)
    if due == state.rerequest_ms(config) and due not in (state.deadline_ms, state.inactive_ms(config), state.interval_ms(config)):
        # ask for the missing items again (before any deadline): their outcomes merge by index, once, like any other
        return GroupTransition(state=replace(state, rerequested=state.rerequested + 1), rerequest=tuple(state.missing_indexes()))
    if state.deadline_ms != due and state.inactive_ms(config) != due:
        # the period's end: every group open in it completes, complete when nothing it expected is missing
        complete = state.position is not None or (state.expected_count is not None and not state.missing_indexes())
        return _complete(state, config, "complete" if complete else "partial", INTERVAL, now_ms)
    reason = TIMEOUT if state.deadline_ms == due else INACTIVITY
    return _complete(state, config, "partial", reason, now_ms)


def on_new_group(state: GroupState | None, config: AggregatorConfig, now_ms: int, reason: str = NEW_GROUP) -> GroupTransition:
    """A part of another key opened a group in this one's partition (``complete_on_new_group``), or the batch its parts
    came in ended (``complete_at_batch_end``, reason ``batch-end``): the open group completes now with what it has,
    status ``complete`` (a group by key expects no count) or, for a group that knew its count and misses some,
    ``partial``. Nothing open: nothing changes."""
    if state is None:
        return GroupTransition(state=None)
    complete = state.position is not None or (state.expected_count is not None and not state.missing_indexes())
    return _complete(state, config, "complete" if complete else "partial", reason, now_ms)


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


@dataclass(frozen=True)
class Part:
    """A message of a correlation group: no index, its place is its arrival (Camel's and Spring's aggregators).

    ``position``: where it was read, (partition, offset, position in its record): a part at or before the
    key's last merged position is a redelivery. ``flag``: complete the group now, with this part.
    ``context``: opaque data kept from the group's first part and handed back with the result.
    """

    payload: Any
    position: tuple[int, ...]
    flag: bool = False
    context: Any = None
    #: the absolute timeout of a group this part opens, read from the part itself (None: the aggregator's ``timeout_ms``)
    timeout_ms: int | None = None


def _part_deadline(config: AggregatorConfig, part: Part, now_ms: int) -> int | None:
    """The absolute deadline of the group ``part`` opens: its own timeout when it carries one, else the aggregator's."""
    return now_ms + part.timeout_ms if part.timeout_ms is not None else config.deadline_from(now_ms)


def on_part(state: GroupState | DoneState | None, config: AggregatorConfig, key: str, part: Part, now_ms: int) -> GroupTransition:
    """A part of a correlation group keyed ``key``: merged in arrival order; the group completes when one of its
    criteria holds, first one wins: the part's ``flag``, ``complete_size`` parts, ``complete_when`` (a timeout or
    a force comes through :func:`on_expire` / :func:`on_force`).

    A redelivered part (at or before the key's last merged position) is counted as a duplicate and dropped.
    After a completion a one-shot key counts later parts as late; a reopening key opens its next group with
    the part that comes next, at once, so no part falls between two groups.
    """
    if isinstance(state, DoneState):
        if state.position is not None and part.position <= state.position:
            return GroupTransition(state=None, done=state)  # a redelivery of a part of the completed group
        if config.groups == ONE_SHOT:
            return GroupTransition(state=None, done=replace(state, late_parts=state.late_parts + 1, position=part.position))
        state = GroupState(
            correlation_id=key, deadline_ms=_part_deadline(config, part, now_ms), opened_ms=now_ms, sequence=state.sequence + 1
        )
    elif state is None:
        state = GroupState(correlation_id=key, deadline_ms=_part_deadline(config, part, now_ms), opened_ms=now_ms, sequence=0)
    elif state.position is not None and part.position <= state.position:
        return GroupTransition(state=replace(state, duplicates=state.duplicates + 1))
    received = dict(state.received)
    received[len(received)] = ItemOutcome(index=len(received), ok=True, result=part.payload)
    context = state.context if state.received else part.context
    group = replace(state, received=received, updated_ms=now_ms, position=part.position, context=context)
    if part.flag:
        return _complete(group, config, "complete", COMPLETE_BY_FLAG, now_ms)
    if config.complete_size is not None and len(received) >= config.complete_size:
        return _complete(group, config, "complete", COMPLETE_BY_SIZE, now_ms)
    if config.complete_when is not None and config.complete_when([outcome.result for _, outcome in sorted(received.items())]):
        return _complete(group, config, "complete", COMPLETE_BY_PREDICATE, now_ms)
    return GroupTransition(state=group)


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
        # a correlation group (parts, no split) expects its complete_size when it has one: a timed-out group names it
        "expected_count": state.expected_count if state.position is None else config.complete_size,
        "items": items,
        "missing": missing,
        "failed": [index for index, outcome in sorted(state.received.items()) if not outcome.ok],
        "opened_ms": state.opened_ms,
        "deadline_ms": state.deadline_ms,
        "completed_ms": now_ms,
        "duplicates": state.duplicates,
        **({"sequence": state.sequence} if state.position is not None else {}),
    }


def complete_now(state: GroupState, config: AggregatorConfig, status: str, reason: str, now_ms: int) -> GroupTransition:
    """Complete a group at once with what it has (a group too large to store: ``TOO_LARGE``)."""
    return _complete(state, config, status, reason, now_ms)


def _stopped(state: GroupState, config: AggregatorConfig, failed: ItemOutcome, now_ms: int) -> GroupTransition:
    """A split's group ended by its first failed item (``on_item_failure="stop"``): status ``failed``, reason
    ``item-failed``, naming the item (``failed_item``) and its cause (``error``); later outcomes are late."""
    transition = _complete(state, config, FAILED_STATUS, ITEM_FAILED, now_ms)
    result = {**transition.emits[0], "failed_item": failed.index, "error": f"item {failed.index} failed: {failed.error}"}
    return replace(transition, emits=(result,))


def _complete(state: GroupState, config: AggregatorConfig, status: str, reason: str, now_ms: int) -> GroupTransition:
    done = DoneState(
        correlation_id=state.correlation_id,
        status=status,
        completed_ms=now_ms,
        expires_ms=now_ms + config.done_retention_ms,
        sequence=state.sequence,
        position=state.position,
        origin=state.origin,
    )
    return GroupTransition(state=None, done=done, emits=(merged_result(state, config, status, reason, now_ms),), context=state.context)


def _check_item(state: GroupState, config: AggregatorConfig, index: int, total: int | None, last: bool) -> str | None:
    return _item_problem(state.correlation_id, state.expected_count, state.last_index, state.received, config, index, total, last)


def _where(config: AggregatorConfig, index: int, correlation_id: str) -> str:
    """How a problem with an item names it (formatted only when there is one: the check runs for every item)."""
    return f"aggregator {config.name!r}: item {index} of group {correlation_id!r}"


def _item_problem(
    correlation_id: str,
    expected_count: int | None,
    last_index: int | None,
    received: Mapping[int, ItemOutcome],
    config: AggregatorConfig,
    index: int,
    total: int | None,
    last: bool,
) -> str | None:
    if index < 0:
        return f"{_where(config, index, correlation_id)} has a negative index"
    if total is not None and total <= 0:
        return f"{_where(config, index, correlation_id)} has total {total}, but a group has at least one item"
    if total is not None and expected_count is not None and total != expected_count:
        return f"{_where(config, index, correlation_id)} has total {total}, but the group expects {expected_count}"
    expected = expected_count if expected_count is not None else total
    if expected is not None and index >= expected:
        return f"{_where(config, index, correlation_id)} is out of range: the group expects {expected} items (indexes 0..{expected - 1})"
    if last and last_index is not None and last_index != index:
        return f"{_where(config, index, correlation_id)} is flagged last, but item {last_index} was already flagged last"
    if last and COMPLETE_BY_FLAG in config.complete_by:
        beyond = [merged for merged in received if merged > index]
        if beyond:
            return f"{_where(config, index, correlation_id)} is flagged last, but items {beyond} with higher indexes already arrived"
    return None
