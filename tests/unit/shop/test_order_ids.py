"""An order id on a screen's day: the first line takes it and is charged; a later line with it is a duplicate, never
charged; the same line asking again (a redelivery) changes nothing."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tables.shop import (
    DUPLICATE,
    OrderClaim,
    ScreenReport,
    Send,
    ShopOrder,
    claim_key,
    on_end,
    on_order,
    on_outcome,
    order_sends,
    parse_shop_order,
)
from tables.shop_cards import card_ref

SCREEN = "day/screen-1"
PROPERTY = settings(max_examples=200, deadline=None, database=None)


def _forward(order_id: str, line: int) -> list[Send]:
    order = ShopOrder(order_id, card_ref("4111111111111111", b"key"), {"mint": 2, "vanilla": 1}, 755)
    return order_sends(order, f"{SCREEN}/{line}", SCREEN, line, deadline_ms=1_000)


def _captures(sends: list[Send]) -> list[str]:
    return [send.key for send in sends if send.to == "payments" and send.value["kind"] == "capture"]


def test_the_first_line_takes_the_id_a_later_line_is_a_duplicate_and_a_redelivery_changes_nothing() -> None:
    claim, sends, refused = on_order(None, SCREEN, f"{SCREEN}/1", 1, "o-1", _forward("o-1", 1))
    assert claim == OrderClaim(SCREEN, "o-1", f"{SCREEN}/1", 1)
    assert refused is None
    assert _captures(sends) == [f"{SCREEN}/1"]
    assert sorted(send.to for send in sends) == ["dispatch", "payments"], "the kitchen is asked only after the capture"

    again, resent, refused = on_order(claim, SCREEN, f"{SCREEN}/1", 1, "o-1", _forward("o-1", 1))
    assert (again, resent, refused) == (claim, sends, None), "the same line again: the same sends, each idempotent downstream"

    kept, answer, refused = on_order(claim, SCREEN, f"{SCREEN}/2", 2, "o-1", _forward("o-1", 2))
    assert kept == claim
    assert _captures(answer) == [], "a duplicate is never charged"
    assert [send.to for send in answer] == ["outcomes", "screens"]
    outcome = answer[0].value
    assert (outcome["ticket"], outcome["line"], outcome["status"], outcome["amount_cents"]) == (f"{SCREEN}/2", 2, DUPLICATE, 0)
    assert "taken by line 1" in outcome["reason"]
    assert refused is not None
    assert "line 2" in refused
    assert "'o-1'" in refused


def test_a_claim_key_tells_screen_and_id_apart_whatever_they_hold() -> None:
    assert claim_key("day/a:b", "c") != claim_key("day/a", "b:c")
    assert claim_key("day/a/b", "c") != claim_key("day/a", "b/c")
    assert claim_key(SCREEN, "o-1") == claim_key(SCREEN, "o-1")


def test_an_order_id_longer_than_the_limit_is_invalid() -> None:
    order, problem = parse_shop_order(
        '{"order_id": "' + "x" * 201 + '", "card": "4111", "items": [{"flavour": "mint", "size": "small"}]}', {"mint": 1}
    )
    assert order is None
    assert "201 characters long" in (problem or "")


def test_the_report_counts_a_duplicate_apart_from_invalid_and_aborted_lines() -> None:
    report, _ = on_outcome(None, SCREEN, 1, "ready", None, 500)
    report, _ = on_outcome(report, SCREEN, 2, DUPLICATE, "duplicate order: ...", 0)
    report, _ = on_outcome(report, SCREEN, 2, DUPLICATE, "duplicate order: ...", 0)  # redelivered: counted once
    report, sends = on_end(report, SCREEN, 2)
    assert report.duplicate == 1
    [final] = sends
    assert (final.value["served"], final.value["duplicate"], final.value["invalid"], final.value["aborted"]) == (1, 1, 0, 0)
    assert ScreenReport.from_dict(report.to_dict()) == report


@PROPERTY
@given(
    ids=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=20),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_each_id_is_charged_once_for_its_first_line_whatever_is_redelivered(ids: list[str], seed: int) -> None:
    """Lines arrive in order (one screen, one customer at a time); any of them may be delivered again, at once or later."""
    rng = random.Random(seed)
    deliveries = [(line, order_id) for line, order_id in enumerate(ids, start=1)]
    for line, order_id in list(deliveries):
        if rng.random() < 0.4:
            deliveries.insert(rng.randrange(deliveries.index((line, order_id)), len(deliveries) + 1), (line, order_id))
    claims: dict[str, OrderClaim] = {}
    charged: dict[str, set[int]] = {}
    report: ScreenReport | None = None
    for line, order_id in deliveries:
        key = claim_key(SCREEN, order_id)
        claim, sends, _ = on_order(claims.get(key), SCREEN, f"{SCREEN}/{line}", line, order_id, _forward(order_id, line))
        claims[key] = claim
        for ticket in _captures(sends):
            charged.setdefault(order_id, set()).add(int(ticket.rsplit("/", 1)[1]))
        for send in sends:
            if send.to == "screens":
                value = send.value
                report, _ = on_outcome(report, SCREEN, value["line"], value["status"], value["reason"], value["amount_cents"])
    first_line = {order_id: ids.index(order_id) + 1 for order_id in set(ids)}
    assert charged == {order_id: {line} for order_id, line in first_line.items()}, "one charged line per id: its first"
    duplicates = len(ids) - len(set(ids))
    assert (report.duplicate if report is not None else 0) == duplicates
