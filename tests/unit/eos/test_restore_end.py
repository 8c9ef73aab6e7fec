"""Faust's recovery ends a restore whose changelog ends in transaction markers as soon as the fetch is past them;
SkippedOffsets.covers, which it asks after every restored record."""

from __future__ import annotations

import types
import uuid
from collections import Counter
from typing import Any

import pytest
from faust.tables.recovery import Recovery
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app.engine import fetcher, restore

restore.end_restores_at_markers()


def recovery(tp: TP, seen: int, highwater: int, in_transaction: bool = True) -> Any:
    """A stand-in for Faust's Recovery with one active changelog partition: last record seen, highwater (end - 1)."""
    stand_in = types.SimpleNamespace(
        app=types.SimpleNamespace(in_transaction=in_transaction),
        active_offsets=Counter({tp: seen}),
        active_highwaters=Counter({tp: highwater}),
    )
    stand_in.active_remaining = lambda: Recovery.active_remaining(stand_in)  # type: ignore[arg-type]
    return stand_in


@pytest.fixture
def tp() -> TP:
    return TP(f"changelog-{uuid.uuid4().hex[:8]}", 0)


def at_position(monkeypatch: pytest.MonkeyPatch, position: int | None) -> None:
    monkeypatch.setattr(fetcher, "fetch_position", lambda app, tp: position)


def test_a_tail_of_markers_the_fetch_stepped_over_ends_the_restore(monkeypatch: pytest.MonkeyPatch, tp: TP) -> None:
    # records 0..7 restored, 8 is the commit marker (the end offset is 9): the fetch stepped over 8
    fetcher.skipped_offsets.note(tp.topic, tp.partition, 8, 9)
    at_position(monkeypatch, 9)
    state = recovery(tp, seen=7, highwater=8)
    assert not Recovery.need_recovery(state)
    assert state.active_offsets[tp] == 8


def test_a_record_not_seen_yet_keeps_the_restore_going(monkeypatch: pytest.MonkeyPatch, tp: TP) -> None:
    # the fetch is at the end, but offset 6 is a record that recovery has not seen yet (on its way)
    fetcher.skipped_offsets.note(tp.topic, tp.partition, 7, 9)
    at_position(monkeypatch, 9)
    state = recovery(tp, seen=5, highwater=8)
    assert Recovery.need_recovery(state)
    assert state.active_offsets[tp] == 5


def test_a_fetch_short_of_the_end_keeps_the_restore_going(monkeypatch: pytest.MonkeyPatch, tp: TP) -> None:
    fetcher.skipped_offsets.note(tp.topic, tp.partition, 8, 9)
    at_position(monkeypatch, 8)
    assert Recovery.need_recovery(recovery(tp, seen=7, highwater=8))
    at_position(monkeypatch, None)  # not assigned, or no position yet
    assert Recovery.need_recovery(recovery(tp, seen=7, highwater=8))


def test_a_changelog_of_aborted_records_only_restores_to_nothing(monkeypatch: pytest.MonkeyPatch, tp: TP) -> None:
    fetcher.skipped_offsets.note(tp.topic, tp.partition, 0, 12)
    at_position(monkeypatch, 12)
    assert not Recovery.need_recovery(recovery(tp, seen=-1, highwater=11))


def test_without_transactions_faust_decides_alone(monkeypatch: pytest.MonkeyPatch, tp: TP) -> None:
    fetcher.skipped_offsets.note(tp.topic, tp.partition, 8, 9)
    at_position(monkeypatch, 9)
    assert Recovery.need_recovery(recovery(tp, seen=7, highwater=8, in_transaction=False))


@settings(max_examples=300, deadline=None)
@given(
    ranges=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=30),
    begin=st.integers(0, 70),
    length=st.integers(1, 20),
)
def test_covers_says_whether_every_offset_of_a_range_was_stepped_over(ranges: list[tuple[int, int]], begin: int, length: int) -> None:
    skipped = fetcher.SkippedOffsets()
    stepped_over: set[int] = set()
    for start, size in ranges:
        skipped.note("t", 0, start, start + size)
        stepped_over.update(range(start, start + size))
    expected = all(offset in stepped_over for offset in range(begin, begin + length))
    assert skipped.covers("t", 0, begin, begin + length) is expected
