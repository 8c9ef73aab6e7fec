"""Session windows' core (weir.tables.windows) by hypothesis: with a grace over any disorder, the sessions are those
of each key's sorted timestamps split where two are a gap or more apart, whatever the order of arrival."""

from __future__ import annotations

import operator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from weir.tables.windows import KeySessions, SessionSpec, on_session_close, on_session_record

records = st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 400), st.integers(1, 9)), max_size=40)


def add(total: Any, value: Any) -> Any:
    return total + value


def run(spec: SessionSpec, arrivals: list[tuple[str, int, int]], flush: bool) -> tuple[set[tuple[str, int, int, int, int]], int]:
    """Every session closed (key, start, end, sum, count), and how many records were late; ``flush``: close all at the end."""
    states: dict[str, KeySessions] = {}
    closed: set[tuple[str, int, int, int, int]] = set()
    late = 0
    stream_time = -1
    for key, stamp, value in arrivals:
        stream_time = max(stream_time, stamp)
        accepted = on_session_record(states.get(key), spec, stamp, value, stream_time, 0, add, operator.add)
        late += len(accepted.late)
        if accepted.state is not None:
            states[key] = accepted.state
        for other, state in list(states.items()):
            left, results = on_session_close(state, spec, stream_time)
            closed |= {(other, start, end, total, count) for start, end, total, count in results}
            if left is None:
                del states[other]
            else:
                states[other] = left
    if flush:
        for key, state in states.items():
            closed |= {(key, start, end, total, count) for start, (end, total, count) in state.open.items()}
    return closed, late


def batch(spec: SessionSpec, arrivals: list[tuple[str, int, int]]) -> set[tuple[str, int, int, int, int]]:
    """By definition: a key's records sorted by time, a new session wherever two are ``gap`` or more apart."""
    sessions: set[tuple[str, int, int, int, int]] = set()
    for key in {key for key, _, _ in arrivals}:
        ordered = sorted((stamp, value) for other, stamp, value in arrivals if other == key)
        start, end, total, count = ordered[0][0], ordered[0][0], 0, 0
        for stamp, value in ordered:
            if stamp - end >= spec.gap_ms:
                sessions.add((key, start, end, total, count))
                start, total, count = stamp, 0, 0
            end, total, count = stamp, total + value, count + 1
        sessions.add((key, start, end, total, count))
    return sessions


@given(st.integers(1, 60), records, st.randoms())
def test_any_order_within_the_grace_gives_the_sessions_of_the_sorted_records(
    gap: int, arrivals: list[tuple[str, int, int]], rng: Any
) -> None:
    spec = SessionSpec(gap, grace_ms=1_000)  # more than any disorder: nothing late, nothing closed too soon
    shuffled = list(arrivals)
    rng.shuffle(shuffled)
    closed, late = run(spec, shuffled, flush=True)
    assert late == 0
    assert closed == batch(spec, arrivals)


@given(st.integers(1, 60), st.integers(0, 30), records)
def test_a_record_is_late_only_when_its_session_would_have_closed_and_nothing_closes_twice(
    gap: int, grace: int, arrivals: list[tuple[str, int, int]]
) -> None:
    spec = SessionSpec(gap, grace)
    closed, late = run(spec, arrivals, flush=False)
    stream_time, expected_late = -1, 0
    for _, stamp, _ in arrivals:
        stream_time = max(stream_time, stamp)
        expected_late += stream_time >= stamp + gap + grace
    assert late == expected_late
    assert len({(key, start) for key, start, *_ in closed}) == len(closed), "a session closes once"
    assert sum(count for *_, count in closed) <= len(arrivals) - late


def test_a_session_state_round_trips_through_its_json() -> None:
    state = KeySessions({10: (40, 7, 3), 100: (100, 1, 1)})
    assert KeySessions.from_dict(state.to_dict()) == state
