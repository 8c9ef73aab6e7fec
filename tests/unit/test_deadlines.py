"""The deadline index over a dict standing in for a Faust table: ticks see each due entry once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app.deadlines import DeadlineIndex, deadline_bucket


class FakeTable(dict[str, Any]):
    pass


def walk(index: DeadlineIndex, now_ms: int, keep: set[str]) -> list[str]:
    seen: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        seen.append(key)
        return key in keep

    asyncio.run(index.walk(0, now_ms, handle))
    return seen


def test_an_earlier_entry_filed_after_a_later_one_comes_due_in_its_own_second() -> None:
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    index.add(0, "client", "idle", 60_000)
    index.add(0, "client", "tombstone", 2_000)
    assert walk(index, 2_100, keep=set()) == ["tombstone"]
    index.add(0, "client", "past", 1_000)  # a second already walked: handed over by the next tick
    assert walk(index, 2_200, keep=set()) == ["past"]
    assert walk(index, 59_000, keep=set()) == []
    assert walk(index, 60_000, keep=set()) == ["idle"]


def test_entries_come_due_in_their_second_and_kept_ones_come_again() -> None:
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    index.add(0, "group", "a", 1_500)
    index.add(0, "group", "b", 3_200)
    assert walk(index, 999, keep=set()) == []
    assert walk(index, 1_000, keep={"a"}) == ["a"], "its second: handed over; the handler keeps it (not due yet)"
    assert walk(index, 1_999, keep={"a"}) == ["a"]
    assert walk(index, 2_000, keep=set()) == ["a"]
    assert walk(index, 2_500, keep=set()) == []
    assert walk(index, 3_300, keep=set()) == ["b"]
    assert walk(index, 9_000, keep=set()) == []


def test_an_entry_filed_for_a_second_already_walked_still_comes_due() -> None:
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    index.add(0, "group", "a", 5_000)
    assert walk(index, 7_000, keep=set()) == ["a"]
    index.add(0, "group", "late", 1_000)
    assert walk(index, 7_100, keep=set()) == ["late"]


def test_a_handler_may_file_new_entries_while_walking() -> None:
    table = FakeTable()
    index = DeadlineIndex(table)  # type: ignore[arg-type]
    index.add(0, "key", "a", 1_000)
    seen: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        seen.append(key)
        if key == "a":
            index.add(0, "key", "a-again", 1_200)  # the bucket being walked
        return False

    asyncio.run(index.walk(0, 1_100, handle))
    assert seen == ["a", "a-again"], "filed in the second being walked: handed over in this walk (the handler checks the time)"
    assert walk(index, 1_300, keep=set()) == []


def test_an_entry_filed_for_a_walked_second_during_a_walk_comes_on_the_next_tick() -> None:
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    index.add(0, "key", "a", 1_000)
    index.add(0, "key", "b", 3_000)
    seen: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        seen.append(key)
        if key == "b":
            index.add(0, "key", "past", 500)  # a second the walk has passed already
        return False

    asyncio.run(index.walk(0, 3_100, handle))
    assert seen == ["a", "b", "past"]
    assert walk(index, 4_000, keep=set()) == []


def test_a_walk_that_raises_resumes_where_it_stopped() -> None:
    """An entry whose handler raises stays; the others of its second and later go on; the next tick retries it."""
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    for number, due_ms in enumerate([1_000, 1_100, 1_200, 2_500, 3_000]):
        index.add(0, "group", f"g{number}", due_ms)
    handled: list[str] = []
    failing = {"g1"}

    async def handle(kind: str, key: str) -> bool:
        if key in failing:
            failing.discard(key)  # raises once
            raise RuntimeError(f"walk broke on {key}")
        handled.append(key)
        return False

    asyncio.run(index.walk(0, 3_500, handle))
    assert handled == ["g0", "g2", "g3", "g4"], "one key that raises holds back no other"
    asyncio.run(index.walk(0, 3_600, handle))
    assert handled == ["g0", "g2", "g3", "g4", "g1"], "the next tick hands over what failed"
    asyncio.run(index.walk(0, 9_000, handle))
    assert handled == ["g0", "g2", "g3", "g4", "g1"], "each entry once"


def test_an_entry_that_always_raises_is_given_up_after_its_attempts_and_reported() -> None:
    index = DeadlineIndex(FakeTable(), max_attempts=3)  # type: ignore[arg-type]
    index.add(0, "group", "poison", 1_000)
    index.add(0, "group", "fine", 5_000)
    given_up: list[str] = []
    handled: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        if key == "poison":
            raise ValueError("bad state")
        handled.append(key)
        return False

    async def give_up(kind: str, key: str, error: Exception) -> None:
        given_up.append(f"{key}: {error}")

    for now in (1_000, 2_000, 3_000, 4_000):
        asyncio.run(index.walk(0, now, handle, on_give_up=give_up))
    assert given_up == ["poison: bad state"]
    asyncio.run(index.walk(0, 5_000, handle, on_give_up=give_up))
    assert handled == ["fine"]


@settings(deadline=None, database=None)
@given(st.lists(st.integers(min_value=0, max_value=20_000), max_size=40), st.lists(st.integers(min_value=0, max_value=25_000), max_size=10))
def test_every_entry_is_handed_over_once_at_or_after_its_second(due: list[int], ticks: list[int]) -> None:
    index = DeadlineIndex(FakeTable())  # type: ignore[arg-type]
    for number, due_ms in enumerate(due):
        index.add(0, "group", f"k{number}:{due_ms}", due_ms)
    handed: list[tuple[str, int]] = []
    for now in [*sorted(ticks), 30_000]:
        handed += [(key, now) for key in walk(index, now, keep=set())]
    assert sorted(key for key, _ in handed) == sorted(f"k{number}:{due_ms}" for number, due_ms in enumerate(due))
    for key, now in handed:
        assert int(key.split(":")[1]) // 1000 <= now // 1000


@pytest.mark.parametrize(
    ("deadline_ms", "bucket_ms", "expected"),
    [(0, 1000, 0), (999, 1000, 0), (1000, 1000, 1), (12_345, 1000, 12), (12_345, 100, 123)],
)
def test_deadline_bucket(deadline_ms: int, bucket_ms: int, expected: int) -> None:
    assert deadline_bucket(deadline_ms, bucket_ms) == expected


@settings(deadline=None, database=None)
@given(st.integers(min_value=0, max_value=2**53), st.integers(min_value=0, max_value=2**53))
def test_deadline_bucket_is_monotonic(first: int, second: int) -> None:
    low, high = sorted((first, second))
    assert deadline_bucket(low) <= deadline_bucket(high)


@settings(deadline=None, database=None)
@given(
    st.lists(st.tuples(st.integers(min_value=0, max_value=20_000), st.integers(min_value=0, max_value=2)), max_size=30),
    st.lists(st.integers(min_value=0, max_value=25_000), max_size=10),
)
def test_handlers_that_raise_a_few_times_still_see_every_entry_handled_once(due: list[tuple[int, int]], ticks: list[int]) -> None:
    """Any entry whose handler raises fewer times than the attempts allows is handled once, at or after its second."""
    index = DeadlineIndex(FakeTable(), max_attempts=3)  # type: ignore[arg-type]
    raises_left: dict[str, int] = {}
    for number, (due_ms, raises) in enumerate(due):
        key = f"k{number}:{due_ms}"
        raises_left[key] = raises
        index.add(0, "group", key, due_ms)
    handled: list[tuple[str, int]] = []
    for now in [*sorted(ticks), 30_000, 31_000, 32_000]:

        async def handle(kind: str, key: str, now: int = now) -> bool:
            if raises_left[key] > 0:
                raises_left[key] -= 1
                raise RuntimeError(key)
            handled.append((key, now))
            return False

        asyncio.run(index.walk(0, now, handle))
    assert sorted(key for key, _ in handled) == sorted(raises_left)
    for key, now in handled:
        assert int(key.split(":")[1]) // 1000 <= now // 1000


def test_a_deadline_long_past_is_filed_now_and_a_walk_after_a_long_stop_is_bounded_per_tick() -> None:
    table = FakeTable()
    index = DeadlineIndex(table)  # type: ignore[arg-type]
    index.max_seconds_per_walk = 10
    index.add(0, "group", "ancient", 0, now_ms=1_000_000)  # due at the epoch: filed in the current second
    assert walk(index, 1_000_500, keep=set()) == ["ancient"]
    index.add(0, "group", "later", 1_000_900)
    index.add(0, "group", "much-later", 1_050_000)
    seen: list[str] = []
    for tick in range(8):  # the worker was away for 60 s: each tick walks at most 10 of the seconds missed
        seen += walk(index, 1_060_000 + tick, keep=set())
    assert seen == ["later", "much-later"]
