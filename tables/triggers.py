"""Counter triggers: the typed values of the trigger tables and their pure state core (batched completions, safety sweep, expiry)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from weir.app.flows import Flow

__all__ = [
    "OK",
    "TriggerConfig",
    "ChildCompletion",
    "TriggerState",
    "FiredState",
    "Wake",
    "Expired",
    "TriggerTransition",
    "on_register",
    "on_completion",
    "on_sweep",
    "on_expiry",
    "sweep_due_ms",
    "sweep_asks",
    "expiry_due_ms",
    "NEVER_FIRED",
    "ORPHAN_COMPLETIONS",
    "outcome_summary",
    "TRIGGERS_TOPIC",
    "DEFAULT_WAKE_TOPIC",
    "registration_message",
    "completion_message",
    "publish_trigger_messages",
]

#: The topic (without the prefix) of registrations, completions and sweep ticks, keyed by parent id.
TRIGGERS_TOPIC = "triggers"
#: Where a fired trigger wakes its parent unless the registration names another topic or a flow.
DEFAULT_WAKE_TOPIC = "trigger-fired"

#: The outcome of a child that succeeded; any other outcome string counts as a failure in the summary.
OK = "ok"
FIRED_BY_COUNT = "count"
FIRED_BY_REGISTRATION = "registration"
FIRED_BY_SWEEP = "sweep"
#: Dead-letter reasons of trigger state dropped unfired at the end of its retention.
NEVER_FIRED = "never-fired"
ORPHAN_COMPLETIONS = "orphan-completions"


@dataclass(frozen=True)
class TriggerConfig:
    """How one trigger consumer treats its triggers: when the sweep may look at them, how long firings are remembered,
    how long state that has not fired is kept after the parent's last event that changed it."""

    name: str
    sweep_grace_ms: int
    done_retention_ms: int = 600_000
    orphan_retention_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.sweep_grace_ms < 0:
            message = f"trigger {self.name!r}: sweep_grace_ms must be zero or positive, got {self.sweep_grace_ms}"
            raise ValueError(message)
        if self.done_retention_ms <= 0:
            message = f"trigger {self.name!r}: done_retention_ms must be positive, got {self.done_retention_ms}"
            raise ValueError(message)
        if self.orphan_retention_ms <= 0:
            message = f"trigger {self.name!r}: orphan_retention_ms must be positive, got {self.orphan_retention_ms}"
            raise ValueError(message)


@dataclass(frozen=True)
class ChildCompletion:
    """A child ended: its id, unique within its parent, and its outcome ("ok" or an error name)."""

    child_id: str
    outcome: str


@dataclass(frozen=True)
class TriggerState:
    """A trigger in table ``triggers``: registered (waiting for ``expected_count`` children) or not yet.

    An unregistered state only remembers the children that completed before the parent registered. Either kind is
    dropped ``orphan_retention_ms`` after ``last_event_ms`` unless it fires first.
    """

    parent_id: str
    first_seen_ms: int
    expected_count: int | None = None
    wake_topic: str | None = None
    #: opaque data of the registration, handed back in the wake record (what the parent needs to go on)
    context: Any = None
    registered_ms: int | None = None
    #: child id -> outcome, each child once
    children: Mapping[str, str] = field(default_factory=dict)
    #: the last event that changed this state (None in states written before it was kept: ``first_seen_ms`` stands in)
    last_event_ms: int | None = None

    @property
    def last_active_ms(self) -> int:
        return self.first_seen_ms if self.last_event_ms is None else self.last_event_ms

    @property
    def registered(self) -> bool:
        return self.expected_count is not None

    @property
    def remaining(self) -> int | None:
        """Children still awaited (the counter); None before registration."""
        if self.expected_count is None:
            return None
        return max(self.expected_count - len(self.children), 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_id": self.parent_id,
            "first_seen_ms": self.first_seen_ms,
            "expected_count": self.expected_count,
            "wake_topic": self.wake_topic,
            "context": self.context,
            "registered_ms": self.registered_ms,
            "remaining": self.remaining,
            "children": dict(sorted(self.children.items())),
            "last_event_ms": self.last_event_ms,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TriggerState:
        expected = raw.get("expected_count")
        registered = raw.get("registered_ms")
        last_event = raw.get("last_event_ms")
        return cls(
            parent_id=str(raw["parent_id"]),
            first_seen_ms=int(raw["first_seen_ms"]),
            expected_count=None if expected is None else int(expected),
            wake_topic=raw.get("wake_topic"),
            context=raw.get("context"),
            registered_ms=None if registered is None else int(registered),
            children={str(child): str(outcome) for child, outcome in (raw.get("children") or {}).items()},
            last_event_ms=None if last_event is None else int(last_event),
        )


@dataclass(frozen=True)
class FiredState:
    """A fired trigger in table ``triggers_fired``: kept for the retention so that redelivered or late events never fire it again."""

    parent_id: str
    fired_ms: int
    expires_ms: int
    fired_by: str
    #: completions that arrived after the firing (redelivered or extra children): absorbed, counted
    late_completions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent_id": self.parent_id,
            "fired_ms": self.fired_ms,
            "expires_ms": self.expires_ms,
            "fired_by": self.fired_by,
            "late_completions": self.late_completions,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FiredState:
        return cls(
            parent_id=str(raw["parent_id"]),
            fired_ms=int(raw["fired_ms"]),
            expires_ms=int(raw["expires_ms"]),
            fired_by=str(raw["fired_by"]),
            late_completions=int(raw.get("late_completions", 0)),
        )


@dataclass(frozen=True)
class Wake:
    """What a firing sends: the record that wakes the parent, to the topic the registration named."""

    topic: str
    record: dict[str, Any]


@dataclass(frozen=True)
class Expired:
    """Trigger state dropped unfired at the end of its retention: the dead letter's reason and message, and what it held."""

    reason: str
    error: str
    record: dict[str, Any]


@dataclass(frozen=True)
class TriggerTransition:
    """The result of one step: the trigger's new state (None: delete the key), its fired marker (None: none, or delete
    it), the wake, what was refused, what expired unfired."""

    state: TriggerState | None
    fired: FiredState | None = None
    wake: Wake | None = None
    rejected: tuple[str, ...] = ()
    expired: Expired | None = None


def outcome_summary(children: Mapping[str, str]) -> dict[str, Any]:
    """The children's outcomes as the parent sees them: how many, counts by outcome, and the ids that did not end ok."""
    by_outcome: dict[str, int] = {}
    for outcome in children.values():
        by_outcome[outcome] = by_outcome.get(outcome, 0) + 1
    return {
        "children": len(children),
        "by_outcome": dict(sorted(by_outcome.items())),
        "failed": sorted(child for child, outcome in children.items() if outcome != OK),
    }


def sweep_due_ms(state: TriggerState, config: TriggerConfig) -> int | None:
    """When the sweep may first look at a registered trigger (registration + grace); None before registration."""
    if state.registered_ms is None:
        return None
    return state.registered_ms + config.sweep_grace_ms


def sweep_asks(state: TriggerState | None, fired: FiredState | None, now_ms: int, config: TriggerConfig) -> bool:
    """Whether the sweep asks the children's committed statuses about this parent: a registered trigger, not fired,
    past its grace period. :func:`on_sweep` fires nothing else, so the sweep asks about nothing else."""
    if fired is not None or state is None or state.expected_count is None:
        return False
    due = sweep_due_ms(state, config)
    return due is not None and now_ms >= due


def on_register(
    state: TriggerState | None,
    fired: FiredState | None,
    parent_id: str,
    expected_count: int,
    wake_topic: str,
    now_ms: int,
    *,
    config: TriggerConfig,
    context: Any = None,
) -> TriggerTransition:
    """The parent registered its trigger: wait for ``expected_count`` children, or fire at once if they all completed already.

    A repeat changes nothing; a registration that contradicts the one in place is refused.
    """
    if fired is not None:
        return TriggerTransition(state=state, fired=fired)  # a redelivered registration of a fired trigger
    where = f"trigger {config.name!r}: registration of parent {parent_id!r}"
    if expected_count <= 0:
        return TriggerTransition(
            state=state, fired=fired, rejected=(f"{where} expects {expected_count} children, but a trigger needs at least 1",)
        )
    if state is not None and state.registered:
        if (state.expected_count, state.wake_topic) != (expected_count, wake_topic):
            problem = (
                f"{where} expects {expected_count} children woken on {wake_topic!r}, but it is registered with "
                f"{state.expected_count} children woken on {state.wake_topic!r}"
            )
            return TriggerTransition(state=state, rejected=(problem,))
        return TriggerTransition(state=state)
    base = state or TriggerState(parent_id=parent_id, first_seen_ms=now_ms)
    registered = replace(
        base, expected_count=expected_count, wake_topic=wake_topic, context=context, registered_ms=now_ms, last_event_ms=now_ms
    )
    if len(registered.children) >= expected_count:
        return _fire(registered, config, FIRED_BY_REGISTRATION, registered.children, now_ms)
    return TriggerTransition(state=registered)


def on_completion(
    state: TriggerState | None,
    fired: FiredState | None,
    parent_id: str,
    completions: Sequence[ChildCompletion],
    now_ms: int,
    *,
    config: TriggerConfig,
) -> TriggerTransition:
    """A batch of completions of one parent's children, in arrival order: each child counted once; fires when the counter reaches zero.

    Completions after the firing (in this batch or later) are absorbed and counted on the fired marker, never applied.
    """
    if not completions:
        return TriggerTransition(state=state, fired=fired)
    if fired is not None:
        return TriggerTransition(state=state, fired=replace(fired, late_completions=fired.late_completions + len(completions)))
    current = state or TriggerState(parent_id=parent_id, first_seen_ms=now_ms)
    children = dict(current.children)
    for position, completion in enumerate(completions):
        if completion.child_id in children:
            continue  # redelivered: counted once already
        children[completion.child_id] = completion.outcome
        if current.expected_count is not None and len(children) >= current.expected_count:
            transition = _fire(current, config, FIRED_BY_COUNT, children, now_ms)
            late = len(completions) - position - 1
            if late and transition.fired is not None:
                return replace(transition, fired=replace(transition.fired, late_completions=late))
            return transition
    if state is not None and len(children) == len(state.children):
        return TriggerTransition(state=state)
    return TriggerTransition(state=replace(current, children=children, last_event_ms=now_ms))


def on_sweep(
    state: TriggerState | None,
    fired: FiredState | None,
    statuses: Mapping[str, str],
    now_ms: int,
    *,
    config: TriggerConfig,
) -> TriggerTransition:
    """The safety sweep looks at a trigger with its children's final statuses, as their own transactions committed
    them (the source of truth: app/trigger_status.py).

    A registered trigger past its grace period whose children are all done fires, though completion events
    were lost; the statuses win over the completions where both name a child. Anything else stays as it is.
    """
    if state is None or state.expected_count is None or not sweep_asks(state, fired, now_ms, config):
        return TriggerTransition(state=state, fired=fired)
    children = {**state.children, **statuses}
    if len(children) < state.expected_count:
        return TriggerTransition(state=state)
    return _fire(state, config, FIRED_BY_SWEEP, children, now_ms)


def expiry_due_ms(state: TriggerState | None, fired: FiredState | None, config: TriggerConfig) -> int | None:
    """When the parent's state is due to go: its fired marker at the end of the done retention; an unfired state
    ``orphan_retention_ms`` after the last event that changed it; None when there is nothing to expire."""
    if fired is not None:
        return fired.expires_ms
    if state is not None:
        return state.last_active_ms + config.orphan_retention_ms
    return None


def on_expiry(
    state: TriggerState | None,
    fired: FiredState | None,
    now_ms: int,
    *,
    config: TriggerConfig,
) -> TriggerTransition:
    """A tick at or after the parent's expiry (:func:`expiry_due_ms`): what it kept goes.

    A fired marker is deleted (events after it start afresh). An unfired state is dropped, described in ``expired``:
    ``never-fired`` for a registered trigger, ``orphan-completions`` for a parent that never registered. (The sweep
    looked at a registered one, with its children's committed statuses, every period until then.)
    """
    due = expiry_due_ms(state, fired, config)
    if due is None or now_ms < due:
        return TriggerTransition(state=state, fired=fired)
    if fired is not None:
        return TriggerTransition(state=state)  # the marker's retention is over (a fired trigger keeps no other state)
    assert state is not None  # a due time means a state or a marker
    idle = f"nothing changed for {now_ms - state.last_active_ms} ms (retention {config.orphan_retention_ms} ms)"
    done = f"{len(state.children)} completions"
    if state.registered:
        reason = NEVER_FIRED
        error = (
            f"trigger {config.name!r}: parent {state.parent_id!r} registered for {state.expected_count} children, "
            f"got {done}, and {idle}: dropped unfired (a registration repeated after its trigger fired and its "
            f"fired mark expired ends here too)"
        )
    else:
        reason = ORPHAN_COMPLETIONS
        error = f"trigger {config.name!r}: parent {state.parent_id!r} never registered; {done} came, and {idle}: dropped"
    record = {
        "trigger": config.name,
        "parent_id": state.parent_id,
        "reason": reason,
        "expired_ms": now_ms,
        "state": state.to_dict(),
    }
    return TriggerTransition(state=None, expired=Expired(reason=reason, error=error, record=record))


def _fire(state: TriggerState, config: TriggerConfig, fired_by: str, children: Mapping[str, str], now_ms: int) -> TriggerTransition:
    fired = FiredState(parent_id=state.parent_id, fired_ms=now_ms, expires_ms=now_ms + config.done_retention_ms, fired_by=fired_by)
    record = {
        "trigger": config.name,
        "trigger_id": state.parent_id,
        "parent_id": state.parent_id,
        "expected_count": state.expected_count,
        "fired_by": fired_by,
        "summary": outcome_summary(children),
        "context": state.context,
        "registered_ms": state.registered_ms,
        "fired_ms": now_ms,
    }
    if state.wake_topic is None:
        message = f"trigger {config.name!r}: parent {state.parent_id!r} fires but was never registered (no wake topic)"
        raise ValueError(message)
    return TriggerTransition(state=None, fired=fired, wake=Wake(topic=state.wake_topic, record=record))


# ---------------------------------------------------------------------------------------------------
# Messages of the ``triggers`` topic, keyed by parent id: the client side of the trigger.

Message = tuple[str, dict[str, Any]]


def registration_message(
    parent_id: str, expected_count: int, *, wake_topic: str = DEFAULT_WAKE_TOPIC, flow: Flow | None = None, context: Any = None
) -> Message:
    """The parent registers its trigger: wake it on ``wake_topic`` (or on the source topic of ``flow``) when its children are done.

    Topic names are given without weir's topic prefix; the wake record carries ``context`` back to the parent.
    """
    if isinstance(expected_count, bool) or not isinstance(expected_count, int) or expected_count <= 0:
        message = f"trigger of parent {parent_id!r}: expected_count must be a positive integer, got {expected_count!r}"
        raise ValueError(message)
    topic = flow.source if flow is not None else wake_topic
    return parent_id, {
        "kind": "register",
        "parent_id": parent_id,
        "expected_count": expected_count,
        "wake_topic": topic,
        "context": context,
    }


def completion_message(parent_id: str, child_id: str, outcome: str = OK) -> Message:
    """A child of ``parent_id`` ended with ``outcome``.

    Send it in the transaction that commits the child's work: a weir agent's Kafka transaction, or the child's
    database transaction through the outbox (:func:`app.trigger_status.child_done`, which also records the status
    the sweep reads), or straight after that transaction committed a status row
    (:func:`app.trigger_status.record_status`, then :class:`app.trigger_status.CompletionPublisher`). One published
    after a commit that recorded no status may be lost, and the sweep cannot see that child.
    """
    return parent_id, {"kind": "completion", "parent_id": parent_id, "child_id": child_id, "outcome": outcome}


async def publish_trigger_messages(bootstrap: str, topic_prefix: str, messages: Iterable[Message]) -> int:
    """Send trigger messages from outside a worker with a plain aiokafka producer; returns how many were sent.

    Inside an agent, send them on ``agents.triggers.triggers_topic`` instead, so they join the event's transaction.
    """
    from weir.app.kafka_io import produce_json  # the state core itself stays free of Kafka

    return await produce_json(bootstrap, f"{topic_prefix}{TRIGGERS_TOPIC}", messages)
