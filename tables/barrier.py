"""Barrier state: exchanges waiting for other flows' executions, and remembered completions, per key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "FlowCompletion",
    "Waiting",
    "BarrierState",
    "Release",
    "Failure",
    "BarrierTransition",
    "on_arrival",
    "on_completion",
    "on_tick",
    "on_relay",
    "on_forwarded",
    "Relay",
    "Forward",
    "COMPLETED",
    "FAILED",
    "OnDuplicate",
    "REJECT",
    "RELEASE_ALL",
    "REPLACE",
    "DUPLICATE_RULES",
    "GiveUp",
    "FAIL",
    "CONTINUE",
    "GIVE_UP_RULES",
    "TIMED_OUT",
    "release_report",
    "Memory",
    "REMEMBER",
    "CONSUME",
    "MEMORY_RULES",
    "reported",
]

COMPLETED = "completed"
FAILED = "failed"

#: What a barrier does with an exchange that arrives on a key where another one already waits.
OnDuplicate = Literal["reject", "release-all", "replace"]
#: The newcomer is dead-lettered 'duplicate-waiter'; the one waiting keeps waiting, unchanged (Spring Integration's barrier).
REJECT: OnDuplicate = "reject"
#: Both wait, each released (or failed) on its own: one completion can release them together.
RELEASE_ALL: OnDuplicate = "release-all"
#: The newcomer waits in place of the one waiting, which is dead-lettered 'superseded'.
REPLACE: OnDuplicate = "replace"
DUPLICATE_RULES: tuple[OnDuplicate, ...] = (REJECT, RELEASE_ALL, REPLACE)

#: What a barrier does with a completion once it let a waiter go on (or failed it): keep it for the barrier's timeout, so
#: that a later waiter on the key is released by it too (seed 004's "remember completions that came first"), or let
#: it be consumed by the release it caused (Spring Integration's barrier: a trigger releases one waiter and is gone).
#: Either way a completion that finds no waiter is kept until one comes or the timeout passes.
Memory = Literal["remember", "consume"]
REMEMBER: Memory = "remember"
CONSUME: Memory = "consume"
MEMORY_RULES: tuple[Memory, ...] = (REMEMBER, CONSUME)

#: What a barrier does with a waiting exchange at its timeout (``on_timeout``) or when an awaited execution failed
#: (``on_failure``): fail it through its flow's error handling (dead letter, failed outcome), or let it go on with
#: what happened in its properties (:func:`release_report`), as Camel's aggregator goes on at its completion timeout.
GiveUp = Literal["fail", "continue"]
FAIL: GiveUp = "fail"
CONTINUE: GiveUp = "continue"
GIVE_UP_RULES: tuple[GiveUp, ...] = (FAIL, CONTINUE)
#: The status of an exchange that went on at its timeout (``on_timeout="continue"``).
TIMED_OUT = "timeout"

# The values below are slotted dataclasses, not frozen ones: some are made per arrival, nothing changes one once made
# (the core makes new ones), and a frozen dataclass's __init__ (object.__setattr__ per field) takes three times as long.


@dataclass(slots=True)
class FlowCompletion:
    """The latest outcome of an awaited flow for this key, remembered until ``expires_ms``."""

    flow: str
    outcome: str
    at_ms: int
    expires_ms: int
    error: str | None = None
    #: what the execution ended with (its payload), for an await that asks for results
    result: Any = None
    #: which of the awaited executions this is, for an await that counts them (``Await(count=...)``)
    part: str | None = None

    def to_dict(self) -> dict[str, Any]:
        raw = {"flow": self.flow, "outcome": self.outcome, "at_ms": self.at_ms, "expires_ms": self.expires_ms, "error": self.error}
        if self.result is not None:
            raw["result"] = self.result
        if self.part is not None:
            raw["part"] = self.part
        return raw

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FlowCompletion:
        part = raw.get("part")
        return cls(
            str(raw["flow"]),
            str(raw["outcome"]),
            int(raw["at_ms"]),
            int(raw["expires_ms"]),
            raw.get("error"),
            raw.get("result"),
            None if part is None else str(part),
        )


@dataclass(slots=True)
class Waiting:
    """An exchange held at the barrier: what it still awaits, its deadline, and itself as it arrived."""

    exchange_id: str
    flow: str
    arrived_ms: int
    deadline_ms: int
    awaited: tuple[str, ...]
    exchange: dict[str, Any]
    resume_step: int
    satisfied: tuple[str, ...] = ()
    #: what the waiting flow needs to finish the execution (its id, the keys read on entry)
    meta: dict[str, Any] = field(default_factory=dict)
    #: awaited flows that correlate by a key of their own (seed 004): flow -> that key. Their completions come
    #: forwarded to this waiter by a :class:`Relay` at that key, never from a completion at this one.
    relayed: dict[str, str] = field(default_factory=dict)
    #: awaited flows whose completions are counted (``Await(count=...)``): flow -> how many distinct executions
    #: (parts) this exchange awaits; a flow awaited zero times is satisfied on arrival
    expected: dict[str, int] = field(default_factory=dict)
    #: what came so far from the awaited executions: flow -> part -> result (a counted await: every part; any
    #: other: part "" with its result, when it has one)
    received: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(flow for flow in self.awaited if flow not in self.satisfied)

    def counted(self, flow: str) -> bool:
        return flow in self.expected

    def take(self, completion: FlowCompletion) -> Waiting:
        """This exchange with ``completion`` (a completed one) taken: counted once per part for a counted await."""
        flow = completion.flow
        if flow in self.satisfied:
            return self
        if self.counted(flow):
            parts = self.received.get(flow, {})
            if completion.part is None or completion.part in parts:
                return self  # not one of the counted executions, or one counted already
            parts = {**parts, completion.part: completion.result}
            done = len(parts) >= self.expected[flow]
            satisfied = (*self.satisfied, flow) if done else self.satisfied
            return replace(self, received={**self.received, flow: parts}, satisfied=satisfied)
        received = self.received if completion.result is None else {**self.received, flow: {"": completion.result}}
        return replace(self, satisfied=(*self.satisfied, flow), received=received)

    def counts(self, completion: FlowCompletion) -> bool:
        """Whether ``completion`` is one this exchange still waits for (a failed one too: it ends the wait)."""
        flow = completion.flow
        if flow not in self.awaited or flow in self.satisfied or flow in self.relayed:
            return False
        if self.counted(flow):
            return completion.part is not None and completion.part not in self.received.get(flow, {})
        return True

    def key_of(self, flow: str, key: str) -> str:
        """The key ``flow`` is awaited under: its own, or ``key`` (the waiter's)."""
        return self.relayed.get(flow, key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "exchange_id": self.exchange_id,
            "flow": self.flow,
            "arrived_ms": self.arrived_ms,
            "deadline_ms": self.deadline_ms,
            "awaited": list(self.awaited),
            "satisfied": list(self.satisfied),
            "exchange": self.exchange,
            "resume_step": self.resume_step,
            "meta": self.meta,
            **({"relayed": dict(self.relayed)} if self.relayed else {}),
            **({"expected": dict(self.expected)} if self.expected else {}),
            **({"received": {flow: dict(parts) for flow, parts in self.received.items()}} if self.received else {}),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Waiting:
        return cls(
            exchange_id=str(raw["exchange_id"]),
            flow=str(raw["flow"]),
            arrived_ms=int(raw["arrived_ms"]),
            deadline_ms=int(raw["deadline_ms"]),
            awaited=tuple(raw["awaited"]),
            exchange=dict(raw["exchange"]),
            resume_step=int(raw["resume_step"]),
            satisfied=tuple(raw.get("satisfied", ())),
            meta=dict(raw.get("meta") or {}),
            relayed={str(flow): str(key) for flow, key in (raw.get("relayed") or {}).items()},
            expected={str(flow): int(count) for flow, count in (raw.get("expected") or {}).items()},
            received={str(flow): dict(parts) for flow, parts in (raw.get("received") or {}).items()},
        )


@dataclass(slots=True)
class Relay:
    """At an awaited flow's own key: an exchange waiting at key ``to`` awaits ``flow`` here. When ``flow`` completes
    here (or already has), the completion is forwarded to the waiter (:class:`Forward`), once."""

    exchange_id: str
    flow: str
    to: str
    deadline_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"exchange_id": self.exchange_id, "flow": self.flow, "to": self.to, "deadline_ms": self.deadline_ms}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Relay:
        return cls(str(raw["exchange_id"]), str(raw["flow"]), str(raw["to"]), int(raw["deadline_ms"]))


@dataclass(slots=True)
class Forward:
    """A completion of ``flow`` at a relay's key, sent to the waiting exchange ``exchange_id`` at key ``to``."""

    to: str
    exchange_id: str
    flow: str
    outcome: str
    error: str | None
    result: Any = None


@dataclass(slots=True)
class BarrierState:
    """Table ``barrier-<name>`` value for one correlation key."""

    key: str
    waiting: tuple[Waiting, ...] = ()
    completions: dict[str, FlowCompletion] = field(default_factory=dict)
    #: exchanges that went on or failed, kept until the barrier's timeout: a redelivered arrival is ignored
    settled: dict[str, int] = field(default_factory=dict)
    #: waiters at other keys that await a flow under this key (:class:`Relay`)
    relays: tuple[Relay, ...] = ()
    #: remembered completions of counted awaits, one per execution (part): flow -> part -> completion
    parts: dict[str, dict[str, FlowCompletion]] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not self.waiting and not self.completions and not self.settled and not self.relays and not self.parts

    def remembered(self, flow: str, now_ms: int) -> list[FlowCompletion]:
        """The completions of ``flow`` remembered here and not expired: the latest one, and every counted part."""
        found = [completion for _, completion in sorted(self.parts.get(flow, {}).items())]
        latest = self.completions.get(flow)
        if latest is not None:
            found.append(latest)
        return [completion for completion in found if completion.expires_ms > now_ms]

    def forget(self, completion: FlowCompletion) -> BarrierState:
        """Without ``completion`` (consumed by the release it caused: a barrier with ``memory="consume"``)."""
        if completion.part is None:
            if self.completions.get(completion.flow) != completion:
                return self
            return replace(self, completions={flow: item for flow, item in self.completions.items() if flow != completion.flow})
        parts = {part: item for part, item in self.parts.get(completion.flow, {}).items() if part != completion.part}
        others = {flow: items for flow, items in self.parts.items() if flow != completion.flow}
        return replace(self, parts={**others, **({completion.flow: parts} if parts else {})})

    def remember(self, completion: FlowCompletion) -> BarrierState:
        if completion.part is None:
            return replace(self, completions={**self.completions, completion.flow: completion})
        parts = {**self.parts.get(completion.flow, {}), completion.part: completion}
        return replace(self, parts={**self.parts, completion.flow: parts})

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "waiting": [waiting.to_dict() for waiting in self.waiting],
            "completions": {flow: completion.to_dict() for flow, completion in sorted(self.completions.items())},
            "settled": dict(sorted(self.settled.items())),
            **({"relays": [relay.to_dict() for relay in self.relays]} if self.relays else {}),
            **(
                {
                    "parts": {
                        flow: {part: item.to_dict() for part, item in sorted(parts.items())} for flow, parts in sorted(self.parts.items())
                    }
                }
                if self.parts
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BarrierState:
        return cls(
            key=str(raw["key"]),
            waiting=tuple(Waiting.from_dict(item) for item in raw.get("waiting", [])),
            completions={flow: FlowCompletion.from_dict(item) for flow, item in raw.get("completions", {}).items()},
            settled={exchange_id: int(until) for exchange_id, until in raw.get("settled", {}).items()},
            relays=tuple(Relay.from_dict(item) for item in raw.get("relays", [])),
            parts={
                str(flow): {str(part): FlowCompletion.from_dict(item) for part, item in parts.items()}
                for flow, parts in (raw.get("parts") or {}).items()
            },
        )

    def next_due_ms(self) -> int | None:
        """The earliest instant a tick has work here (a deadline, or something to forget)."""
        instants = [waiting.deadline_ms for waiting in self.waiting]
        instants += [completion.expires_ms for completion in self.completions.values()]
        instants += list(self.settled.values())
        instants += [relay.deadline_ms for relay in self.relays]
        instants += [item.expires_ms for parts in self.parts.values() for item in parts.values()]
        return min(instants, default=None)


@dataclass(slots=True)
class Release:
    """An exchange that goes on at ``resume_step``: every awaited flow completed (``status`` completed), or, under
    ``on_timeout``/``on_failure="continue"``, its timeout passed (``timeout``) or an awaited execution failed (``failed``)."""

    waiting: Waiting
    status: str = COMPLETED
    error: str | None = None


def release_report(release: Release) -> dict[str, Any]:
    """What a barrier tells the exchange it lets go (``properties["barriers"][name]``): how the wait ended, what it
    still missed, and the results of the awaited executions (per flow, in part order; a result is their payload)."""
    waiting = release.waiting
    results = {flow: [parts[part] for part in sorted(parts)] for flow, parts in sorted(waiting.received.items())}
    return {"status": release.status, "error": release.error, "missing": list(waiting.missing), "results": results}


def reported(release: Release, barrier_name: str) -> dict[str, Any]:
    """The released exchange (as stored) with the barrier's report in ``properties["barriers"][barrier_name]``."""
    exchange = release.waiting.exchange
    properties = dict(exchange.get("properties") or {})
    properties["barriers"] = {**(properties.get("barriers") or {}), barrier_name: release_report(release)}
    return {**exchange, "properties": properties}


@dataclass(slots=True)
class Failure:
    """An exchange given up: an awaited flow failed definitively, the timeout passed, or the duplicate rule refused it.

    ``missing``: the awaited flows it still waited for (none for an exchange refused as a duplicate waiter).
    """

    waiting: Waiting
    reason: str
    error: str
    missing: tuple[str, ...]


@dataclass(slots=True)
class BarrierTransition:
    state: BarrierState | None
    releases: tuple[Release, ...] = ()
    failures: tuple[Failure, ...] = ()
    forwards: tuple[Forward, ...] = ()


def _current(state: BarrierState, flow: str, now_ms: int) -> FlowCompletion | None:
    completion = state.completions.get(flow)
    return completion if completion is not None and completion.expires_ms > now_ms else None


def _settle(state: BarrierState, waiting: Waiting) -> BarrierState:
    # Remembered for another timeout past the deadline: an arrival redelivered after the exchange went
    # on, failed, or timed out is ignored, never released or failed a second time.
    settled_until_ms = waiting.deadline_ms + max(0, waiting.deadline_ms - waiting.arrived_ms)
    remaining = tuple(item for item in state.waiting if item.exchange_id != waiting.exchange_id)
    return replace(state, waiting=remaining, settled={**state.settled, waiting.exchange_id: settled_until_ms})


def _finish(state: BarrierState) -> BarrierState | None:
    return None if state.is_empty() else state


def _check_rule(name: str, value: str, allowed: tuple[str, ...], barrier_name: str) -> None:
    if value not in allowed:
        message = f"barrier {barrier_name!r}: {name} must be one of {list(allowed)}, got {value!r}"
        raise ValueError(message)


def _given_up(state: BarrierState, waiting: Waiting, failure: Failure, on_failure: GiveUp) -> tuple[BarrierState, Release | Failure]:
    """An awaited execution failed for ``waiting``: it fails, or (``on_failure="continue"``) goes on, marked failed."""
    settled = _settle(state, waiting)
    if on_failure == CONTINUE:
        return settled, Release(waiting, FAILED, failure.error)
    return settled, failure


def on_arrival(
    state: BarrierState | None,
    key: str,
    waiting: Waiting,
    barrier_name: str,
    now_ms: int,
    *,
    on_duplicate: OnDuplicate,
    on_failure: GiveUp = FAIL,
    memory: Memory = REMEMBER,
) -> BarrierTransition:
    """An exchange reached the barrier: it goes on at once if every awaited flow already completed.

    One that arrives while another exchange waits on the key is handled by ``on_duplicate``. A redelivered
    arrival (an exchange id waiting or settled here) is no second waiter: it changes nothing.
    """
    _check_rule("on_duplicate", on_duplicate, DUPLICATE_RULES, barrier_name)
    _check_rule("on_failure", on_failure, GIVE_UP_RULES, barrier_name)
    current = state or BarrierState(key=key)
    if waiting.exchange_id in current.settled or any(item.exchange_id == waiting.exchange_id for item in current.waiting):
        return BarrierTransition(state=state)  # redelivered arrival: counted once
    superseded: list[Failure] = []
    if current.waiting and on_duplicate == REJECT:
        first = current.waiting[0]
        error = (
            f"barrier {barrier_name!r}: exchange {waiting.exchange_id!r} of flow {waiting.flow!r} arrived for key {key!r} "
            f"while exchange {first.exchange_id!r} waits there; the barrier takes one waiter per key (on_duplicate='reject')"
        )
        # Settled like any exchange given up: a redelivered copy of the refused arrival is ignored, not refused twice.
        return BarrierTransition(state=_settle(current, waiting), failures=(Failure(waiting, "duplicate-waiter", error, ()),))
    if current.waiting and on_duplicate == REPLACE:
        for older in current.waiting:  # one under this rule; more if the barrier ran under 'release-all' before
            error = (
                f"barrier {barrier_name!r}: exchange {older.exchange_id!r} of flow {older.flow!r} waiting for key {key!r} "
                f"was replaced by exchange {waiting.exchange_id!r} (on_duplicate='replace')"
            )
            superseded.append(Failure(older, "superseded", error, older.missing))
            current = _settle(current, older)
    transition = _admit(current, key, waiting, barrier_name, now_ms, on_failure, memory)
    return replace(transition, failures=(*superseded, *transition.failures))


def _admit(
    current: BarrierState, key: str, waiting: Waiting, barrier_name: str, now_ms: int, on_failure: GiveUp, memory: Memory = REMEMBER
) -> BarrierTransition:
    """The arrival once the duplicate rule let it in: failed, released, or waiting for what has not completed yet.
    Under ``memory="consume"`` the remembered completions it takes are gone once it goes on or fails."""
    # A flow awaited zero times (a counted await with nothing to count) is satisfied on arrival.
    arrived = replace(waiting, satisfied=tuple(flow for flow in waiting.awaited if waiting.expected.get(flow, 1) <= 0))
    for flow in waiting.awaited:
        if flow in waiting.relayed:
            continue  # awaited under its own key: its completion comes forwarded
        for completion in current.remembered(flow, now_ms):
            if not arrived.counts(completion):
                continue
            if memory == CONSUME:  # it is this waiter's now (a waiter that still waits keeps it as satisfied)
                current = current.forget(completion)
            if completion.outcome == FAILED:
                error = f"barrier {barrier_name!r}: awaited flow {flow!r} failed for key {key!r}: {completion.error}"
                settled, ended = _given_up(current, arrived, Failure(arrived, "awaited-failed", error, (flow,)), on_failure)
                return _ended(settled, ended)
            arrived = arrived.take(completion)
    if not arrived.missing:
        return BarrierTransition(state=_finish(_settle(current, arrived)), releases=(Release(arrived),))
    return BarrierTransition(state=replace(current, waiting=(*current.waiting, arrived)))


def _ended(state: BarrierState, ended: Release | Failure) -> BarrierTransition:
    if isinstance(ended, Release):
        return BarrierTransition(state=_finish(state), releases=(ended,))
    return BarrierTransition(state=_finish(state), failures=(ended,))


def on_completion(
    state: BarrierState | None,
    key: str,
    flow: str,
    outcome: str,
    error: str | None,
    remember_ms: int,
    barrier_name: str,
    now_ms: int,
    *,
    result: Any = None,
    part: str | None = None,
    on_failure: GiveUp = FAIL,
    memory: Memory = REMEMBER,
) -> BarrierTransition:
    """An awaited flow's execution ended for ``key``: remember it, and release or fail who waits for it.

    ``part`` names the execution for a counted await (each part counts once, however often it comes); ``result``
    is its payload, for an await that asks for results. Under ``memory="consume"`` a completion that a waiter
    takes is not remembered: a later waiter on the key waits for a completion of its own.
    """
    _check_rule("on_failure", on_failure, GIVE_UP_RULES, barrier_name)
    _check_rule("memory", memory, MEMORY_RULES, barrier_name)
    current = state or BarrierState(key=key)
    completion = FlowCompletion(flow, outcome, now_ms, now_ms + remember_ms, error, result, part)
    consumed = memory == CONSUME and any(waiting.counts(completion) for waiting in current.waiting)
    updated = current if consumed else current.remember(completion)
    releases: list[Release] = []
    failures: list[Failure] = []
    for waiting in current.waiting:
        if not waiting.counts(completion):
            continue
        if outcome == FAILED:
            message = f"barrier {barrier_name!r}: awaited flow {flow!r} failed for key {key!r}: {error}"
            updated, ended = _given_up(updated, waiting, Failure(waiting, "awaited-failed", message, (flow,)), on_failure)
            if isinstance(ended, Release):
                releases.append(ended)
            else:
                failures.append(ended)
            continue
        advanced = waiting.take(completion)
        if advanced.missing:
            updated = replace(
                updated, waiting=tuple(advanced if item.exchange_id == waiting.exchange_id else item for item in updated.waiting)
            )
        else:
            releases.append(Release(advanced))
            updated = _settle(updated, advanced)
    forwards = tuple(Forward(relay.to, relay.exchange_id, flow, outcome, error, result) for relay in updated.relays if relay.flow == flow)
    if forwards:
        updated = replace(updated, relays=tuple(relay for relay in updated.relays if relay.flow != flow))
        for relay in current.relays:
            if relay.flow == flow:
                updated = replace(updated, settled={**updated.settled, relay.exchange_id: relay.deadline_ms})
    return BarrierTransition(state=_finish(updated), releases=tuple(releases), failures=tuple(failures), forwards=forwards)


def on_relay(state: BarrierState | None, key: str, relay: Relay, now_ms: int) -> BarrierTransition:
    """A waiter at key ``relay.to`` awaits ``relay.flow`` under this key: forward its completion now if it is
    remembered here, else when it comes. A redelivered relay (its exchange id relayed or settled here) changes nothing.
    """
    current = state or BarrierState(key=key)
    if relay.exchange_id in current.settled or any(item.exchange_id == relay.exchange_id for item in current.relays):
        return BarrierTransition(state=state)
    completion = _current(current, relay.flow, now_ms)
    if completion is None:
        return BarrierTransition(state=replace(current, relays=(*current.relays, relay)))
    forward = Forward(relay.to, relay.exchange_id, relay.flow, completion.outcome, completion.error, completion.result)
    settled = replace(current, settled={**current.settled, relay.exchange_id: relay.deadline_ms})
    return BarrierTransition(state=_finish(settled), forwards=(forward,))


def on_forwarded(
    state: BarrierState | None,
    key: str,
    exchange_id: str,
    flow: str,
    outcome: str,
    error: str | None,
    barrier_name: str,
    *,
    result: Any = None,
    on_failure: GiveUp = FAIL,
) -> BarrierTransition:
    """A relay forwarded ``flow``'s completion under its own key to the waiter ``exchange_id`` here: it counts for
    that waiter alone (nothing is remembered for the key). A waiter that went on or failed already ignores it."""
    _check_rule("on_failure", on_failure, GIVE_UP_RULES, barrier_name)
    if state is None:
        return BarrierTransition(state=None)
    waiting = next((item for item in state.waiting if item.exchange_id == exchange_id), None)
    if waiting is None or flow not in waiting.relayed or flow in waiting.satisfied:
        return BarrierTransition(state=state)
    if outcome == FAILED:
        message = f"barrier {barrier_name!r}: awaited flow {flow!r} failed for key {waiting.relayed[flow]!r}: {error}"
        settled, ended = _given_up(state, waiting, Failure(waiting, "awaited-failed", message, (flow,)), on_failure)
        return _ended(settled, ended)
    advanced = waiting.take(FlowCompletion(flow, outcome, 0, 0, error, result))
    if not advanced.missing:
        return BarrierTransition(state=_finish(_settle(state, advanced)), releases=(Release(advanced),))
    waiting_now = tuple(advanced if item.exchange_id == exchange_id else item for item in state.waiting)
    return BarrierTransition(state=replace(state, waiting=waiting_now))


def on_tick(state: BarrierState | None, barrier_name: str, now_ms: int, *, on_timeout: GiveUp = FAIL) -> BarrierTransition:
    """Time passed: give up exchanges past their deadline (or, ``on_timeout="continue"``, let them go on marked
    ``timeout``); forget expired completions and settled ids."""
    _check_rule("on_timeout", on_timeout, GIVE_UP_RULES, barrier_name)
    if state is None:
        return BarrierTransition(state=None)
    failures: list[Failure] = []
    releases: list[Release] = []
    updated = state
    for waiting in state.waiting:
        if waiting.deadline_ms <= now_ms:
            awaited = ", ".join(f"{flow!r} (key {waiting.key_of(flow, state.key)!r})" for flow in waiting.missing)
            message = (
                f"barrier {barrier_name!r}: exchange {waiting.exchange_id!r} of flow {waiting.flow!r} timed out still awaiting {awaited}"
            )
            if on_timeout == CONTINUE:
                releases.append(Release(waiting, TIMED_OUT, message))
            else:
                failures.append(Failure(waiting, "timeout", message, waiting.missing))
            updated = _settle(updated, waiting)
    completions = {flow: completion for flow, completion in updated.completions.items() if completion.expires_ms > now_ms}
    parts = {
        flow: kept
        for flow, kept in (
            (flow, {part: item for part, item in items.items() if item.expires_ms > now_ms}) for flow, items in updated.parts.items()
        )
        if kept
    }
    settled = {exchange_id: until for exchange_id, until in updated.settled.items() if until > now_ms}
    relays = tuple(relay for relay in updated.relays if relay.deadline_ms > now_ms)  # the waiter timed out by now
    updated = replace(updated, completions=completions, settled=settled, relays=relays, parts=parts)
    return BarrierTransition(state=_finish(updated), releases=tuple(releases), failures=tuple(failures))
