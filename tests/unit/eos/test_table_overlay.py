"""The write-once overlay of ``engine.WeirTable`` inside a scope, against a plain dict model.

Inside ``engine.part_scope`` reads see the scope's own writes, a key written many times is written to the
store and the changelog once (its last value), a key deleted that the store had gets one tombstone, a key
created and deleted inside the scope leaves no trace, and a scope that raises writes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import faust
import pytest
from faust.tables.base import Collection
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app import engine

KEYS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("get"), KEYS),
        st.tuples(st.just("getitem"), KEYS),
        st.tuples(st.just("contains"), KEYS),
        st.tuples(st.just("set"), KEYS, st.integers(0, 9)),
        st.tuples(st.just("del"), KEYS),
        st.tuples(st.just("iterate")),
    ),
    max_size=30,
)


class Delivered(asyncio.Future[Any]):
    """What Faust's send_changelog returns: a future whose message names its partition."""

    def __init__(self) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.message = SimpleNamespace(partition=0)
        self.set_result(None)


PATCHES: list[Any] = []


@pytest.fixture(autouse=True)
def _unpatch() -> Iterator[None]:
    yield
    while PATCHES:
        PATCHES.pop().stop()


def make_table(initial: dict[str, int]) -> tuple[Any, list[tuple[str, Any]]]:
    app = faust.App(f"overlay-{id(initial)}", store="memory://", Table="weir.app.engine:WeirTable", autodiscover=False)
    table = app.Table("t", default=None, partitions=1)
    changelog: list[tuple[str, Any]] = []

    def send_changelog(self: Any, partition: int, key: str, value: Any, *args: Any, **kwargs: Any) -> Delivered:
        changelog.append((key, value))
        return Delivered()

    # Faust's own send (below WeirTable's, which adds it to the scope's pending deliveries)
    patcher = mock.patch.object(Collection, "send_changelog", send_changelog)
    patcher.start()
    PATCHES.append(patcher)
    table.partition_for_key = lambda key: 0
    for key, value in initial.items():
        table.data[key] = value
    return table, changelog


class Event:
    """The part of a Faust event a scope uses (weak-referenceable, like Faust's)."""

    message = SimpleNamespace(partition=0, topic="source", offset=0, generation_id=0, tp=None)


def event() -> Any:
    return Event()


def apply(target: Any, op: tuple[Any, ...]) -> Any:
    match op:
        case ("get", key):
            return target.get(key, "absent")
        case ("getitem", key):
            try:
                return target[key]
            except KeyError:
                return "KeyError"
        case ("contains", key):
            return key in target
        case ("set", key, value):
            target[key] = value
            return None
        case ("del", key):
            try:
                del target[key]
            except KeyError:
                return "KeyError"
            return None
        case ("iterate",):
            return sorted(target.items())
    raise AssertionError(op)


@settings(max_examples=300, deadline=None)
@given(initial=st.dictionaries(KEYS, st.integers(0, 9)), ops=OPS)
def test_a_scope_reads_its_own_writes_and_writes_each_key_once(initial: dict[str, int], ops: list[tuple[Any, ...]]) -> None:
    async def run() -> None:
        table, changelog = make_table(initial)
        model = dict(initial)
        pending: list[Any] = []
        written: set[str] = set()
        try:
            with engine.part_scope(event(), pending):
                for op in ops:
                    result = apply(table, op)
                    assert result == apply(model, op), op
                    if op[0] == "set" or (op[0] == "del" and result is None):
                        written.add(op[1])
        finally:
            while PATCHES:
                PATCHES.pop().stop()
        assert dict(table.data.items()) == model
        if not any(op[0] == "iterate" for op in ops):
            # without an iteration (which writes the overlay out first) every key is written at most once:
            # its last value, a tombstone when the store had it, nothing when it was created and deleted here
            keys = [key for key, _ in changelog]
            assert len(keys) == len(set(keys))
            expected = {key: model.get(key) for key in written if key in model or key in initial}
            assert dict(changelog) == expected
        assert len(pending) == len(changelog), "every changelog write is awaited by the scope"

    asyncio.run(run())


def test_a_scope_that_raises_writes_nothing() -> None:
    async def run() -> None:
        table, changelog = make_table({"a": 1})

        def handler() -> None:
            table["a"] = 2
            table["b"] = 3
            raise RuntimeError("handler failed")

        with pytest.raises(RuntimeError, match="handler failed"), engine.part_scope(event(), []):
            handler()
        assert dict(table.data.items()) == {"a": 1}
        assert changelog == []

    asyncio.run(run())


def test_outside_a_scope_the_table_is_fausts() -> None:
    async def run() -> None:
        table, changelog = make_table({})
        table["a"] = 1  # no scope: straight to the store and the changelog
        assert changelog == [("a", 1)]
        assert dict(table.data.items()) == {"a": 1}

    asyncio.run(run())
