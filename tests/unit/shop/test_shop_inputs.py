"""Whatever a screen's line holds, it gets its one outcome: the orders stage's reading of a line, the screen's size check,
and the order files' reading (newlines only, a BOM, not UTF-8)."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.shop_orders import parse_envelope, read_order, ticket_parts
from app.shop_demo import read_lines
from app.shop_screens import Screens
from tables.shop import LineRanges, ScreenReport, add_line, has_line, lines_counted, on_outcome

#: The lines that once ended the demo with no report for any screen.
NASTY_LINES = {
    "deeply nested": "[" * 1000 + "]" * 1000,
    "300 KB of escaped quotes": '"' + '\\"' * 150_000 + '"',
    "unhashable flavour": '{"order_id": "o", "card": "4111", "items": [{"flavour": [], "size": "small"}]}',
    "a list": "[1, 2, 3]",
    "not JSON": "{order",
}


@pytest.mark.parametrize("name", list(NASTY_LINES))
def test_a_bad_line_is_read_as_invalid_with_a_reason(name: str) -> None:
    order, problem = read_order(NASTY_LINES[name], None)
    assert order is None
    assert problem


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=300),
        st.recursive(
            st.none() | st.integers(min_value=-(2**60), max_value=2**60) | st.text(max_size=8),
            lambda inner: st.lists(inner) | st.dictionaries(st.text(max_size=8), inner),
            max_leaves=20,
        ).map(lambda value: orjson.dumps(value).decode()),
    )
)
def test_read_order_never_raises(line: str) -> None:
    order, problem = read_order(line, None)
    assert (order is None) != (problem is None)


def test_a_line_too_large_to_send_is_answered_from_its_size_and_hash() -> None:
    screens = Screens("127.0.0.1:1", lambda name: name, max_record_bytes=1_000)
    small = orjson.loads(screens.envelope("d/s/1", "d/s", 1, "x" * 100))
    assert small["text"] == "x" * 100
    big = screens.envelope("d/s/2", "d/s", 2, "é" * 5_000)
    assert len(big) <= 1_000
    ticket, screen, line, text, too_large = parse_envelope(orjson.loads(big))
    assert (ticket, screen, line, text) == ("d/s/2", "d/s", 2, None)
    assert too_large is not None
    assert too_large["size_bytes"] == 10_000
    order, problem = read_order(text, too_large)
    assert order is None
    assert "line too large: 10000 bytes" in str(problem)


def test_a_ticket_names_its_screen_and_line() -> None:
    assert ticket_parts("2026-12-01T120000/screen-a/17") == ("2026-12-01T120000/screen-a", 17)
    assert ticket_parts("no-line") is None
    assert ticket_parts("d/s/x") is None


def test_order_files_split_on_newlines_only_without_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes('\ufeff{"a": "x\u2028y"}\r\n{"b": "\u0085"}\n'.encode())
    assert read_lines(path) == ['{"a": "x\u2028y"}', '{"b": "\u0085"}']
    bad = tmp_path / "latin.jsonl"
    bad.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(ValueError, match=r"latin\.jsonl: not UTF-8"):
        read_lines(bad)


@pytest.mark.parametrize("extra", [{"count": -5}, {"quantity": 3}])
def test_an_unknown_item_field_is_refused_by_name(extra: dict[str, int]) -> None:
    line = orjson.dumps({"order_id": "o-1", "card": "4111", "items": [{"flavour": "vanilla", "size": "small", **extra}]}).decode()
    order, problem = read_order(line, None)
    assert order is None
    assert f"unknown field(s) {sorted(extra)!r}" in str(problem)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=60), max_size=80))
def test_line_ranges_hold_exactly_the_lines_added_in_any_order(lines: list[int]) -> None:
    ranges: LineRanges = ()
    for line in lines:
        ranges = add_line(ranges, line)
    assert lines_counted(ranges) == len(set(lines))
    assert all(has_line(ranges, line) for line in lines)
    assert not any(has_line(ranges, line) for line in set(range(0, 62)) - set(lines))
    assert all(first < end for first, end in ranges)
    assert all(previous_end < first for (_, previous_end), (first, _) in itertools.pairwise(ranges))


def test_a_report_written_after_many_lines_stays_small_and_reads_back_older_forms() -> None:
    state: ScreenReport | None = None
    for line in range(1, 10_001):
        state, _ = on_outcome(state, "d/s", line, "ready", None, 100)
    assert state is not None
    assert len(orjson.dumps(state.to_dict())) < 300
    assert ScreenReport.from_dict(state.to_dict()) == state
    older = {**state.to_dict(), "lines_seen": [1, 2, 3, 7]}
    assert ScreenReport.from_dict(older).lines_seen == ((1, 4), (7, 8))
