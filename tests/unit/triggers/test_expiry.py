"""Property tests of the counter trigger's retention: every piece of a parent's state goes in bounded time.

A virtual clock drives the core the way the shell does (``agents/triggers.py``): events change the state, children
commit their statuses to their database (which the trigger's state never holds), ticks run the sweep over those
statuses and, once the expiry is due, ``on_expiry``. Nothing here sleeps or touches Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weir.tables.triggers import (
    NEVER_FIRED,
    OK,
    ORPHAN_COMPLETIONS,
    ChildCompletion,
    Expired,
    FiredState,
    TriggerConfig,
    TriggerState,
    TriggerTransition,
    Wake,
    expiry_due_ms,
    on_completion,
    on_expiry,
    on_register,
    on_sweep,
)

PROPERTY = settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CONFIG = TriggerConfig(name="t", sweep_grace_ms=1_000, done_retention_ms=5_000, orphan_retention_ms=8_000)
PARENT = "p"


@dataclass
class Parent:
    """One parent's keyed state as the shell keeps it, driven event by event on a virtual clock.

    Every input that reaches an unfired state belongs to the current episode; an episode ends by one wake or one
    dead letter. Inputs that reach a fired marker are absorbed (counted on it) and belong to no episode.
    """

    now: int = 0
    state: TriggerState | None = None
    fired: FiredState | None = None
    #: the children's statuses as their database holds them (app/trigger_status.py): not the trigger's state
    committed: dict[str, str] = field(default_factory=dict)
    #: episode number -> the inputs it took ("register", or a child id)
    episodes: dict[int, list[str]] = field(default_factory=lambda: {0: []})
    #: episode number -> how it ended: ("wake", Wake) or ("dead", Expired)
    endings: dict[int, list[tuple[str, Wake | Expired]]] = field(default_factory=dict)
    last_event_ms: int = 0

    @property
    def episode(self) -> int:
        return max(self.episodes)

    def _take(self, transition: TriggerTransition) -> None:
        self.state, self.fired = transition.state, transition.fired
        ending: tuple[str, Wake | Expired] | None = None
        if transition.wake is not None:
            ending = ("wake", transition.wake)
        elif transition.expired is not None:
            ending = ("dead", transition.expired)
        if ending is not None:
            self.endings.setdefault(self.episode, []).append(ending)
            self.episodes[self.episode + 1] = []

    def _input(self, what: str) -> None:
        self.last_event_ms = self.now
        if self.fired is None:
            self.episodes[self.episode].append(what)

    def register(self, expected: int) -> None:
        self._input("register")
        self._take(on_register(self.state, self.fired, PARENT, expected, "wake", self.now, config=CONFIG))

    def complete(self, child: str) -> None:
        self._input(child)
        self._take(on_completion(self.state, self.fired, PARENT, [ChildCompletion(child, OK)], self.now, config=CONFIG))

    def commit(self, child: str) -> None:
        """The child's transaction commits its status (its completion event is lost)."""
        self.committed.setdefault(child, OK)

    def tick(self) -> None:
        """The shell's tick: the sweep looks at a registered trigger, then the expiry of a key that is due."""
        if self.state is not None and self.state.registered:
            self._take(on_sweep(self.state, self.fired, self.committed, self.now, config=CONFIG))
        due = expiry_due_ms(self.state, self.fired, CONFIG)
        if due is not None and due <= self.now:
            self._take(on_expiry(self.state, self.fired, self.now, config=CONFIG))

    @property
    def empty(self) -> bool:
        return self.state is None and self.fired is None


events = st.one_of(
    st.tuples(st.just("register"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("completion"), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("commit"), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("tick"), st.just(0)),
)
#: gaps between events: mostly short, sometimes past a grace, a retention, or both
gaps = st.sampled_from([0, 1, 300, 999, 1_000, 4_999, 5_000, 7_999, 8_000, 13_000, 20_000])


def run(script: list[tuple[tuple[str, Any], int]]) -> Parent:
    """Each step: the clock moves by its gap, then the event (or the tick) happens."""
    parent = Parent()
    for (kind, value), gap in script:
        parent.now += gap
        if kind == "register":
            parent.register(value)
        elif kind == "completion":
            parent.complete(value)
        elif kind == "commit":
            parent.commit(value)
        else:
            parent.tick()
    return parent


scripts = st.lists(st.tuples(events, gaps), max_size=25)


@PROPERTY
@given(scripts)
def test_after_the_last_event_and_the_retentions_and_a_tick_nothing_is_left(script: list[Any]) -> None:
    parent = run(script)
    # Unfired state goes orphan_retention_ms after its last change; a firing at that tick leaves a marker for
    # done_retention_ms: two more ticks see everything gone.
    parent.now = max(parent.now, parent.last_event_ms + CONFIG.orphan_retention_ms)
    parent.tick()
    parent.now += CONFIG.done_retention_ms
    parent.tick()
    assert parent.empty, (parent.state, parent.fired)


@PROPERTY
@given(scripts)
def test_every_episode_ends_once_and_what_never_fired_is_in_exactly_one_dead_letter(script: list[Any]) -> None:
    parent = run(script)
    parent.now = max(parent.now, parent.last_event_ms + CONFIG.orphan_retention_ms)
    parent.tick()
    parent.now += CONFIG.done_retention_ms
    parent.tick()
    for episode, inputs in parent.episodes.items():
        endings = parent.endings.get(episode, [])
        if not inputs:
            assert not endings, f"episode {episode} took no input but ended {endings}"
            continue
        assert len(endings) == 1, f"episode {episode} with inputs {inputs} ended {len(endings)} times: {endings}"
        [(how, what)] = endings
        if how == "wake":
            assert "register" in inputs, "only a registered trigger wakes its parent"
            continue
        assert isinstance(what, Expired)
        held = what.record["state"]
        children = set(held["children"])
        assert children == {item for item in inputs if item != "register"}, "the dead letter holds every child it dropped"
        if "register" in inputs:
            assert what.reason == NEVER_FIRED
            assert held["expected_count"] is not None
        else:
            assert what.reason == ORPHAN_COMPLETIONS
            assert held["expected_count"] is None


@PROPERTY
@given(scripts, st.integers(min_value=0, max_value=30_000))
def test_a_tick_before_the_expiry_changes_nothing_a_sweep_would_not(script: list[Any], wait_ms: int) -> None:
    """Nothing goes early: a key's state lasts at least its retention from the last event that changed it."""
    parent = run(script)
    before = (parent.state, parent.fired)
    due = expiry_due_ms(parent.state, parent.fired, CONFIG)
    transition = on_expiry(parent.state, parent.fired, parent.now + wait_ms, config=CONFIG)
    if due is None or parent.now + wait_ms < due:
        assert (transition.state, transition.fired) == before
        assert transition.expired is None
        assert transition.wake is None


def test_completions_of_a_parent_that_never_registers_go_to_one_dead_letter() -> None:
    parent = Parent()
    parent.complete("a")
    parent.now += 3_000
    parent.complete("b")
    parent.complete("a")  # redelivered: changes nothing, so it does not push the expiry back
    parent.now = 3_000 + CONFIG.orphan_retention_ms - 1
    parent.tick()
    assert parent.state is not None, "kept for the whole retention after its last change"
    parent.now += 1
    parent.tick()
    assert parent.empty
    [(how, expired)] = parent.endings[0]
    assert how == "dead"
    assert isinstance(expired, Expired)
    assert expired.reason == ORPHAN_COMPLETIONS
    assert expired.record["state"]["children"] == {"a": OK, "b": OK}
    assert "never registered" in expired.error


def test_completions_after_the_fired_mark_expired_and_a_repeated_registration_expire_too() -> None:
    parent = Parent()
    parent.register(1)
    parent.complete("a")
    assert parent.fired is not None
    parent.now += CONFIG.done_retention_ms
    parent.tick()
    assert parent.empty, "the fired mark goes at the end of the done retention"
    parent.complete("a")  # late: its mark is gone, so it starts a new, unregistered state
    parent.register(2)  # a repeat of the first registration, too late to be recognised
    parent.commit("a")
    parent.now += CONFIG.orphan_retention_ms
    parent.tick()
    assert parent.empty
    [(how, expired)] = parent.endings[1]
    assert how == "dead"
    assert isinstance(expired, Expired)
    assert expired.reason == NEVER_FIRED
    assert "registered for 2 children" in expired.error


def test_a_registered_trigger_whose_children_all_committed_is_woken_by_the_sweep_not_dropped() -> None:
    parent = Parent()
    parent.register(2)
    parent.commit("a")
    parent.commit("b")
    parent.now += CONFIG.orphan_retention_ms
    parent.tick()
    [(how, wake)] = parent.endings[0]
    assert how == "wake"
    assert isinstance(wake, Wake)
    assert wake.record["fired_by"] == "sweep"


def test_old_states_without_a_last_event_expire_from_their_first_sighting() -> None:
    state = TriggerState.from_dict({"parent_id": "p", "first_seen_ms": 100, "children": {"a": OK}})
    assert state.last_event_ms is None
    assert expiry_due_ms(state, None, CONFIG) == 100 + CONFIG.orphan_retention_ms
