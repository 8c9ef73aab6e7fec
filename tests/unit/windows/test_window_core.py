"""The event-time window core (tables/windows.py) against brute force and a sequential reference, by hypothesis."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from weir.tables.windows import KeyWindows, WindowSpec, on_close, on_record

specs = st.builds(
    lambda size, hops, grace: WindowSpec.hopping(size, max(1, size // hops), grace),
    st.integers(1, 50),
    st.integers(1, 4),
    st.integers(0, 60),
)
records = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 300), st.integers(-5, 5)), max_size=60)


def fold(total: Any, value: Any) -> Any:
    return total + value


@given(specs, st.integers(0, 10_000))
def test_a_timestamp_is_in_exactly_the_windows_that_hold_it(spec: WindowSpec, timestamp: int) -> None:
    brute = [start for start in range(0, timestamp + 1) if start % spec.advance_ms == 0 and start <= timestamp < start + spec.size_ms]
    assert spec.starts(timestamp) == brute


def run_partition(
    spec: WindowSpec, arrivals: list[tuple[str, int, int]]
) -> tuple[dict[tuple[str, int], tuple[int, int]], int, dict[str, KeyWindows]]:
    """The core driven as the stage drives it: stream time the running maximum, every due window closed after each
    record. Returns each closed window's (sum, count), the late (record, window) pairs, and what stays open."""
    states: dict[str, KeyWindows] = {}
    closed: dict[tuple[str, int], tuple[int, int]] = {}
    late = 0
    stream_time = -1
    for key, timestamp, value in arrivals:
        stream_time = max(stream_time, timestamp)
        accepted = on_record(states.get(key), spec, timestamp, value, stream_time, 0, fold)
        late += len(accepted.late)
        if accepted.state is not None:
            states[key] = accepted.state
        for other, state in list(states.items()):
            left, results = on_close(state, spec, stream_time)
            for start, total, count in results:
                assert (other, start) not in closed, "a window closes once"
                closed[(other, start)] = (total, count)
            if left is None:
                del states[other]
            else:
                states[other] = left
    return closed, late, states


def reference(spec: WindowSpec, arrivals: list[tuple[str, int, int]]) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
    """By definition: a record goes into each of its windows that the stream time at its arrival had not closed; a
    window is closed once the final stream time reaches its end plus grace."""
    sums: dict[tuple[str, int], list[int]] = defaultdict(list)
    late = 0
    stream_time = -1
    for key, timestamp, value in arrivals:
        stream_time = max(stream_time, timestamp)
        for start in range(0, timestamp + 1):
            if start % spec.advance_ms or not start <= timestamp < start + spec.size_ms:
                continue
            if stream_time >= start + spec.size_ms + spec.grace_ms:
                late += 1
            else:
                sums[(key, start)].append(value)
    closed = {
        window: (sum(values), len(values)) for window, values in sums.items() if stream_time >= window[1] + spec.size_ms + spec.grace_ms
    }
    return closed, late


@given(specs, records)
def test_closed_windows_and_late_records_match_the_sequential_reference(spec: WindowSpec, arrivals: list[tuple[str, int, int]]) -> None:
    closed, late, _ = run_partition(spec, arrivals)
    assert (closed, late) == reference(spec, arrivals)


@given(st.integers(1, 40), records, st.randoms())
def test_with_grace_over_the_disorder_the_order_of_arrival_changes_no_window(
    size: int, arrivals: list[tuple[str, int, int]], rng: Any
) -> None:
    spec = WindowSpec.tumbling(size, grace_ms=400)  # more than any timestamp's distance to another: nothing is late
    shuffled = list(arrivals)
    rng.shuffle(shuffled)
    in_order = run_partition(spec, sorted(arrivals, key=lambda record: record[1]))
    any_order = run_partition(spec, shuffled)
    assert in_order[1] == any_order[1] == 0
    assert in_order[0] == any_order[0]
    assert {key: state.open for key, state in in_order[2].items()} == {key: state.open for key, state in any_order[2].items()}


@given(specs, records)
def test_a_window_state_round_trips_through_its_json(spec: WindowSpec, arrivals: list[tuple[str, int, int]]) -> None:
    _, _, states = run_partition(spec, arrivals)
    for state in states.values():
        assert KeyWindows.from_dict(state.to_dict()) == state


@given(specs, st.integers(0, 120), records)
def test_with_a_retention_closed_windows_stay_until_it_ends_and_count_their_late_records(
    plain: WindowSpec, extra: int, arrivals: list[tuple[str, int, int]]
) -> None:
    """Against the reference: the same final results; a closed window is kept while stream time is below its end plus
    the retention, and counts every record late for it that came while it was kept (a record late for some of its
    hopping windows and folded into the others included)."""
    spec = WindowSpec.hopping(plain.size_ms, plain.advance_ms, plain.grace_ms, plain.grace_ms + extra)
    assert run_partition(spec, arrivals)[0] == run_partition(plain, arrivals)[0], "the retention changes no result"
    _, _, states = run_partition(spec, arrivals)
    stream_time = max((timestamp for _, timestamp, _ in arrivals), default=-1)
    expected_late: dict[tuple[str, int], int] = defaultdict(int)
    closed_at: dict[tuple[str, int], int] = {}
    running = -1
    for key, timestamp, _ in arrivals:
        running = max(running, timestamp)
        for start in spec.starts(timestamp):
            window = (key, start)
            if running >= spec.closes_at(start):
                if window in closed_at and running < spec.expires_at(start):
                    expected_late[window] += 1
            else:
                closed_at.setdefault(window, spec.closes_at(start))
    kept = {
        (key, start): expected_late[(key, start)]
        for (key, start) in closed_at
        if spec.closes_at(start) <= stream_time < spec.expires_at(start)
    }
    found = {(key, start): late for key, state in states.items() for start, (_, _, late) in state.closed.items()}
    assert found == kept
