"""Whatever a screen's line holds, it gets its one outcome: the orders stage's reading of a line, the screen's size check,
and the order files' reading (newlines only, a BOM, not UTF-8)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shop.day import DAY
from shop.screens import Screens, Unreadable, read_screen_lines
from shop.stages.orders import parse_envelope, read_order, ticket_parts
from shop.state import outcome_sends
from weir.tables.eof import ClientTotals, on_batch, on_report

#: The lines that once ended the demo with no report for any screen.
#: the key of the tokens of cards that come in clear (a worker's WEIR_SHOP_CARD_KEY)
CARD_KEY = b"unit-test-card-key"

NASTY_LINES = {
    "deeply nested": "[" * 1000 + "]" * 1000,
    "300 KB of escaped quotes": '"' + '\\"' * 150_000 + '"',
    "unhashable flavour": '{"order_id": "o", "card": "4111", "items": [{"flavour": [], "size": "small"}]}',
    "a list": "[1, 2, 3]",
    "not JSON": "{order",
}


@pytest.mark.parametrize("name", list(NASTY_LINES))
def test_a_bad_line_is_read_as_invalid_with_a_reason(name: str) -> None:
    order, problem = read_order(NASTY_LINES[name], None, CARD_KEY)
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
    order, problem = read_order(line, None, CARD_KEY)
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
    order, problem = read_order(text, too_large, CARD_KEY)
    assert order is None
    assert "line too large: 10000 bytes" in str(problem)


def test_a_ticket_names_its_screen_and_line() -> None:
    assert ticket_parts("2026-12-01T120000/screen-a/17") == ("2026-12-01T120000/screen-a", 17)
    assert ticket_parts("no-line") is None
    assert ticket_parts("d/s/x") is None


def test_order_files_split_on_newlines_only_without_a_bom(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes('\ufeff{"a": "x\u2028y"}\r\n{"b": "\u0085"}\n'.encode())
    assert read_screen_lines(path) == ['{"a": "x\u2028y"}', '{"b": "\u0085"}']


def test_a_line_that_is_not_utf8_is_unreadable_alone_and_the_others_are_read(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"order_id": "1"}\n\xff\xfe{}\r\n{"order_id": "3"}\n')
    first, bad, third = read_screen_lines(path)
    assert (first, third) == ('{"order_id": "1"}', '{"order_id": "3"}')
    assert isinstance(bad, Unreadable)
    assert bad.size_bytes == 4
    assert "not UTF-8" in bad.reason


@pytest.mark.parametrize("extra", [{"count": -5}, {"quantity": 3}])
def test_an_unknown_item_field_is_refused_by_name(extra: dict[str, int]) -> None:
    line = orjson.dumps({"order_id": "o-1", "card": "4111", "items": [{"flavour": "vanilla", "size": "small", **extra}]}).decode()
    order, problem = read_order(line, None, CARD_KEY)
    assert order is None
    assert f"unknown field(s) {sorted(extra)!r}" in str(problem)


def test_a_screen_s_day_state_written_after_many_lines_stays_small() -> None:
    """The controller's and the aggregate stage's values for a day of 10,000 lines: what each write holds does not
    grow with the lines (the changelog's bytes grow with the lines, not with their square)."""
    counter, day = None, None
    for line in range(1, 10_001):
        outcome = {"ticket": f"d/s/{line}", "screen": "d/s", "line": line, "status": "ready", "reason": None, "amount_cents": 100}
        for send in outcome_sends({**outcome, "scoops": {"mint": 1}}):
            if send.to == "eof-counter":
                counter = on_report(counter, "d/s", send.value["batch_id"], send.value["forwarded"], line).state
            elif send.to == "eof-aggregate":
                records = [DAY.select(record) for record in send.value["records"]]
                day = on_batch(day, "d/s", send.value["batch_id"], records, line, DAY).state
    assert counter is not None
    assert day is not None
    assert (len(counter.reported), day.records, day.totals["served"]) == (10_000, 10_000, 10_000)
    assert len(orjson.dumps(counter.to_dict())) < 300
    assert len(orjson.dumps(day.to_dict())) < 600
    assert ClientTotals.from_dict(orjson.loads(orjson.dumps(day.to_dict()))) == day
