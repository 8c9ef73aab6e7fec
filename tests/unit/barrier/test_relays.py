"""Awaits with keys of their own (seed 004): relays forward an awaited flow's completion to the waiter's key.

A small router drives the pure core across several keys: one FIFO queue per key (as a partition is), any
interleaving between keys, and the forwards a relay emits queued to the waiter's key.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from weir.tables.barrier import (
    COMPLETED,
    FAILED,
    REJECT,
    BarrierState,
    BarrierTransition,
    Failure,
    Relay,
    Release,
    Waiting,
    on_arrival,
    on_completion,
    on_forwarded,
    on_relay,
    on_tick,
)

BARRIER = "dispatch-gate"
REMEMBER_MS = 60_000
TIMEOUT_MS = 30_000
#: Awaited flow -> the key it correlates by for the waiting exchange: kitchen by order id, payment by payment ref.
OWN_KEYS = {"kitchen": "order-1", "payment": "pay-9"}


@dataclass
class Router:
    """Every key's state, and its queue of messages not yet handled."""

    now: int = 1_000
    states: dict[str, BarrierState | None] = field(default_factory=dict)
    queues: dict[str, deque[tuple[str, Any]]] = field(default_factory=dict)
    releases: list[Release] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def send(self, key: str, kind: str, body: Any) -> None:
        self.queues.setdefault(key, deque()).append((kind, body))

    def arrive(self, exchange_id: str, waiting_key: str) -> None:
        """What the flow sends in one transaction: the arrival at its key, a relay at each other flow's own key."""
        relayed = {flow: key for flow, key in OWN_KEYS.items() if key != waiting_key}
        waiting = Waiting(
            exchange_id=exchange_id,
            flow="dispatch",
            arrived_ms=self.now,
            deadline_ms=self.now + TIMEOUT_MS,
            awaited=tuple(OWN_KEYS),
            exchange={"id": exchange_id},
            resume_step=2,
            relayed=relayed,
        )
        self.send(waiting_key, "arrival", waiting)
        for flow, key in relayed.items():
            self.send(key, "relay", Relay(exchange_id, flow, waiting_key, waiting.deadline_ms))

    def step(self, key: str) -> None:
        kind, body = self.queues[key].popleft()
        state = self.states.get(key)
        transition: BarrierTransition
        if kind == "arrival":
            transition = on_arrival(state, key, body, BARRIER, self.now, on_duplicate=REJECT)
        elif kind == "relay":
            transition = on_relay(state, key, body, self.now)
        elif kind == "completion":
            flow, outcome = body
            transition = on_completion(state, key, flow, outcome, "broke" if outcome == FAILED else None, REMEMBER_MS, BARRIER, self.now)
        else:
            transition = on_forwarded(state, key, body.exchange_id, body.flow, body.outcome, body.error, BARRIER)
        self.states[key] = transition.state
        self.releases.extend(transition.releases)
        self.failures.extend(transition.failures)
        for forward in transition.forwards:
            self.send(forward.to, "forwarded", forward)

    def pending(self) -> list[str]:
        return [key for key, queue in self.queues.items() if queue]


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(st.sampled_from(sorted(OWN_KEYS)), max_size=3),
    after=st.lists(st.sampled_from(sorted(OWN_KEYS)), max_size=4),
    failing=st.sampled_from([None, *sorted(OWN_KEYS)]),
    noise=st.booleans(),
    order=st.randoms(use_true_random=False),
)
def test_a_waiter_is_released_once_when_each_flow_completed_under_its_own_key(
    before: list[str], after: list[str], failing: str | None, noise: bool, order: Any
) -> None:
    """Completions (repeated, some before the arrival) each at their flow's own key; a payment completion at the
    order's key (another payment whose ref is 'order-1') is noise that must release nothing."""
    router = Router()
    for flow in before:
        router.send(OWN_KEYS[flow], "completion", (flow, FAILED if flow == failing else COMPLETED))
    for key in list(router.pending()):
        while router.queues[key]:
            router.step(key)
    router.arrive("ex-1", "order-1")
    if noise:
        router.send("order-1", "completion", ("payment", COMPLETED))
    for flow in after:
        router.send(OWN_KEYS[flow], "completion", (flow, FAILED if flow == failing else COMPLETED))
    while pending := router.pending():
        router.step(order.choice(pending))
    completed = set(before) | set(after)
    failed_one = failing is not None and failing in completed
    if failed_one:
        assert not router.releases
        [failure] = router.failures
        assert failure.reason == "awaited-failed"
    elif completed == set(OWN_KEYS):
        [release] = router.releases
        assert set(release.waiting.satisfied) == set(OWN_KEYS)
        assert not router.failures
    else:
        assert not router.releases, "released without every awaited flow completed under its own key"
        assert not router.failures


def test_a_redelivered_relay_forwards_once_and_a_timed_out_waiter_ignores_late_forwards() -> None:
    router = Router()
    router.arrive("ex-1", "order-1")
    router.send("pay-9", "relay", Relay("ex-1", "payment", "order-1", router.now + TIMEOUT_MS))  # a redelivery
    router.send("pay-9", "completion", ("payment", COMPLETED))
    while pending := router.pending():
        router.step(pending[0])
    waiting = router.states["order-1"]
    assert waiting is not None
    [entry] = waiting.waiting
    assert entry.satisfied == ("payment",)
    router.now += TIMEOUT_MS
    transition = on_tick(router.states["order-1"], BARRIER, router.now)
    [failure] = transition.failures
    assert failure.reason == "timeout"
    assert "'kitchen' (key 'order-1')" in failure.error
    after = on_forwarded(transition.state, "order-1", "ex-1", "kitchen", COMPLETED, None, BARRIER)
    assert not after.releases
    assert on_tick(router.states["pay-9"], BARRIER, router.now + 10 * TIMEOUT_MS).state is None, "relay state is bounded"


def test_the_dead_letter_key_of_a_relayed_flow_is_its_own() -> None:
    waiting = Waiting("ex", "dispatch", 0, 10, ("kitchen", "payment"), {}, 1, relayed={"payment": "pay-9"})
    assert waiting.key_of("payment", "order-1") == "pay-9"
    assert waiting.key_of("kitchen", "order-1") == "order-1"
    assert Waiting.from_dict(waiting.to_dict()) == waiting
    state = BarrierState(key="pay-9", relays=(Relay("ex", "payment", "order-1", 10),))
    assert BarrierState.from_dict(state.to_dict()) == state
    assert state.next_due_ms() == 10
