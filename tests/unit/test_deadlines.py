"""The deadline index over a dict standing in for a Faust table: ticks see each due entry once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app.deadlines import MAX_KEYS_PER_ENTRY, MAX_MERGED_KEY_LENGTH, DeadlineIndex, deadline_bucket


class FakeTable(dict[str, Any]):
    pass


class ScopedTable(FakeTable):
    """A table written in scopes, as a WeirTable in a part's scope: what was written since the scope began is the
    scope's own (``written_in_scope``), and the index merges the keys it files there."""

    def __init__(self) -> None:
        super().__init__()
        self.in_scope: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.in_scope.add(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.in_scope.discard(key)

    def written_in_scope(self, key: str) -> Any:
        return self.get(key) if key in self.in_scope else None

    def end_scope(self) -> None:
        self.in_scope.clear()


def fill(table: FakeTable, index: DeadlineIndex, entries: list[tuple[str, int]], scope_sizes: list[int]) -> None:
    """File ``entries`` (key, due) in scopes of ``scope_sizes`` entries (then one each) when the table has scopes."""
    sizes = iter(scope_sizes)
    left = next(sizes, 1)
    for key, due_ms in entries:
        index.add(0, "group", key, due_ms)
        left -= 1
        if left <= 0 and isinstance(table, ScopedTable):
            table.end_scope()
            left = next(sizes, 1)
    if isinstance(table, ScopedTable):
        table.end_scope()


def entry_values(table: FakeTable) -> list[Any]:
    return [value for key, value in sorted(table.items()) if key.count(":") == 2]


def walk(index: DeadlineIndex, now_ms: int, keep: set[str]) -> list[str]:
    seen: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        seen.append(key)
        return key in keep

    asyncio.run(index.walk(0, now_ms, handle))
    return seen


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_an_earlier_entry_filed_after_a_later_one_comes_due_in_its_own_second(table_kind: type) -> None:
    index = DeadlineIndex(table_kind())  # type: ignore[arg-type]
    index.add(0, "client", "idle", 60_000)
    index.add(0, "client", "tombstone", 2_000)
    assert walk(index, 2_100, keep=set()) == ["tombstone"]
    index.add(0, "client", "past", 1_000)  # a second already walked: handed over by the next tick
    assert walk(index, 2_200, keep=set()) == ["past"]
    assert walk(index, 59_000, keep=set()) == []
    assert walk(index, 60_000, keep=set()) == ["idle"]


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_entries_come_due_in_their_second_and_kept_ones_come_again(table_kind: type) -> None:
    index = DeadlineIndex(table_kind())  # type: ignore[arg-type]
    index.add(0, "group", "a", 1_500)
    index.add(0, "group", "b", 3_200)
    assert walk(index, 999, keep=set()) == []
    assert walk(index, 1_000, keep={"a"}) == ["a"], "its second: handed over; the handler keeps it (not due yet)"
    assert walk(index, 1_999, keep={"a"}) == ["a"]
    assert walk(index, 2_000, keep=set()) == ["a"]
    assert walk(index, 2_500, keep=set()) == []
    assert walk(index, 3_300, keep=set()) == ["b"]
    assert walk(index, 9_000, keep=set()) == []


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_an_entry_filed_for_a_second_already_walked_still_comes_due(table_kind: type) -> None:
    index = DeadlineIndex(table_kind())  # type: ignore[arg-type]
    index.add(0, "group", "a", 5_000)
    assert walk(index, 7_000, keep=set()) == ["a"]
    index.add(0, "group", "late", 1_000)
    assert walk(index, 7_100, keep=set()) == ["late"]


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_a_handler_may_file_new_entries_while_walking(table_kind: type) -> None:
    table = table_kind()
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


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_an_entry_filed_for_a_walked_second_during_a_walk_comes_on_the_next_tick(table_kind: type) -> None:
    index = DeadlineIndex(table_kind())  # type: ignore[arg-type]
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


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_a_walk_that_raises_resumes_where_it_stopped(table_kind: type) -> None:
    """An entry whose handler raises stays; the others of its second and later go on; the next tick retries it."""
    index = DeadlineIndex(table_kind())  # type: ignore[arg-type]
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


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_an_entry_that_always_raises_is_given_up_after_its_attempts_and_reported(table_kind: type) -> None:
    index = DeadlineIndex(table_kind(), max_attempts=3)  # type: ignore[arg-type]
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
@given(
    st.lists(st.integers(min_value=0, max_value=20_000), max_size=40),
    st.lists(st.integers(min_value=0, max_value=25_000), max_size=10),
    st.sampled_from([FakeTable, ScopedTable]),
    st.lists(st.integers(min_value=1, max_value=40), max_size=5),
)
def test_every_entry_is_handed_over_once_at_or_after_its_second(due: list[int], ticks: list[int], kind: type, scopes: list[int]) -> None:
    table = kind()
    index = DeadlineIndex(table)
    fill(table, index, [(f"k{number}:{due_ms}", due_ms) for number, due_ms in enumerate(due)], scopes)
    handed: list[tuple[str, int]] = []
    for now in [*sorted(ticks), 30_000]:
        handed += [(key, now) for key in walk(index, now, keep=set())]
        if isinstance(table, ScopedTable):
            table.end_scope()  # each tick is a scope of its own
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
    st.sampled_from([FakeTable, ScopedTable]),
    st.lists(st.integers(min_value=1, max_value=30), max_size=5),
)
def test_handlers_that_raise_a_few_times_still_see_every_entry_handled_once(
    due: list[tuple[int, int]], ticks: list[int], kind: type, scopes: list[int]
) -> None:
    """Any key whose handler raises fewer times than the attempts allow is handled once, at or after its second,
    filed alone or merged with others (whose handlers raise other numbers of times)."""
    table = kind()
    index = DeadlineIndex(table, max_attempts=3)
    raises_left = {f"k{number}:{due_ms}": raises for number, (due_ms, raises) in enumerate(due)}
    fill(table, index, [(key, int(key.split(":")[1])) for key in raises_left], scopes)
    handled: list[tuple[str, int]] = []
    for now in [*sorted(ticks), 30_000, 31_000, 32_000]:

        async def handle(kind: str, key: str, now: int = now) -> bool:
            if raises_left[key] > 0:
                raises_left[key] -= 1
                raise RuntimeError(key)
            handled.append((key, now))
            return False

        asyncio.run(index.walk(0, now, handle))
        if isinstance(table, ScopedTable):
            table.end_scope()
    assert sorted(key for key, _ in handled) == sorted(raises_left)
    for key, now in handled:
        assert int(key.split(":")[1]) // 1000 <= now // 1000


@pytest.mark.parametrize("table_kind", [FakeTable, ScopedTable])
def test_a_deadline_long_past_is_filed_now_and_a_walk_after_a_long_stop_is_bounded_per_tick(table_kind: type) -> None:
    table = table_kind()
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


def test_keys_one_scope_files_in_one_second_share_entries_of_at_most_the_bound() -> None:
    table = ScopedTable()
    index = DeadlineIndex(table)  # type: ignore[arg-type]
    many = MAX_KEYS_PER_ENTRY * 2 + 50
    for number in range(many):
        index.add(0, "done", f"d{number}", 1_500)
    index.add(0, "group", "g0", 1_600)  # another kind: an entry of its own
    index.add(0, "done", "d-last", 1_700)  # after it: a new entry
    index.add(0, "done", "d-next-second", 2_100)
    table.end_scope()
    index.add(0, "done", "d-next-scope", 1_800)  # a later scope never changes an earlier one's entry
    assert table["0:1"] == 6
    assert [len(entry[1]) if isinstance(entry[1], list) else 1 for entry in entry_values(table)[:6]] == [
        MAX_KEYS_PER_ENTRY, MAX_KEYS_PER_ENTRY, 50, 1, 1, 1,
    ]  # fmt: skip
    assert walk(index, 1_999, keep=set()) == [f"d{number}" for number in range(many)] + ["g0", "d-last", "d-next-scope"]
    assert not [key for key in table if key.startswith("0:1:")], "every entry of the second walked is gone"


def test_a_merged_entry_keeps_only_its_failing_keys_and_gives_each_up_after_its_attempts() -> None:
    table = ScopedTable()
    index = DeadlineIndex(table, max_attempts=3)  # type: ignore[arg-type]
    for number in range(5):
        index.add(0, "group", f"g{number}", 1_000 + number)
    table.end_scope()
    raises = {"g1": 1, "g3": 99}
    handled: list[str] = []
    given_up: list[str] = []

    async def handle(kind: str, key: str) -> bool:
        if raises.get(key, 0) > 0:
            raises[key] -= 1
            raise RuntimeError(key)
        handled.append(key)
        return False

    async def give_up(kind: str, key: str, error: Exception) -> None:
        given_up.append(key)

    asyncio.run(index.walk(0, 1_500, handle, on_give_up=give_up))
    assert handled == ["g0", "g2", "g4"]
    assert entry_values(table) == [["group", ["g1", "g3"], 1]], "the keys that failed stay, their failures counted"
    for now in (1_600, 1_700, 1_800):
        asyncio.run(index.walk(0, now, handle, on_give_up=give_up))
    assert handled == ["g0", "g2", "g4", "g1"]
    assert given_up == ["g3"], "given up once, after its attempts"
    assert entry_values(table) == []


def test_a_long_key_gets_an_entry_of_its_own() -> None:
    table = ScopedTable()
    index = DeadlineIndex(table)  # type: ignore[arg-type]
    long = "x" * (MAX_MERGED_KEY_LENGTH + 1)
    for key in ("a", long, "b", "c"):
        index.add(0, "done", key, 1_000)
    assert entry_values(table) == [["done", "a"], ["done", long], ["done", ["b", "c"]]]
