"""A barrier's memory against a sequential reference, by hypothesis: any sequence of arrivals and completions on one
key (release-all, one awaited flow, no expiry), under ``remember`` and under ``consume``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.barrier.test_barrier import waiting_for
from weir.tables.barrier import COMPLETED, CONSUME, RELEASE_ALL, REMEMBER, BarrierState, Memory, on_arrival, on_completion

KEY = "k"
FLOW = "queue://kitchen"
FOREVER = 10**12


def run(events: list[str], memory: Memory) -> list[str]:
    """The exchanges released, in order, as the core releases them."""
    state: BarrierState | None = None
    released: list[str] = []
    for now, event in enumerate(events):
        if event == "arrival":
            waiting = waiting_for((FLOW,), now, exchange_id=f"ex-{now}", timeout_ms=FOREVER)
            transition = on_arrival(state, KEY, waiting, "b", now, on_duplicate=RELEASE_ALL, memory=memory)
        else:
            transition = on_completion(state, KEY, FLOW, COMPLETED, None, FOREVER, "b", now, memory=memory)
        state = transition.state
        released.extend(release.waiting.exchange_id for release in transition.releases)
    return released


def reference(events: list[str], memory: Memory) -> list[str]:
    """By definition: a completion releases every waiter; with none waiting it is kept. Under remember it stays kept;
    under consume the release (or the arrival that takes a kept one) uses it up."""
    waiting: list[str] = []
    kept = False
    released: list[str] = []
    for now, event in enumerate(events):
        if event == "arrival":
            if kept:
                released.append(f"ex-{now}")
                kept = memory == REMEMBER
            else:
                waiting.append(f"ex-{now}")
        else:
            released.extend(waiting)
            kept = memory == REMEMBER or not waiting
            waiting = []
    return released


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(["arrival", "completion"]), max_size=30), st.sampled_from([REMEMBER, CONSUME]))
def test_releases_match_the_reference_under_either_memory(events: list[str], memory: Memory) -> None:
    assert run(events, memory) == reference(events, memory)


def test_the_two_memories_differ_on_a_second_waiter() -> None:
    events = ["arrival", "completion", "arrival"]
    assert run(events, REMEMBER) == ["ex-0", "ex-2"]
    assert run(events, CONSUME) == ["ex-0"]
