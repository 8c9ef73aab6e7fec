"""An order id on a screen's day: the first line takes it and is charged; a later line with it is a duplicate, never
charged; the same line asking again (a redelivery) changes nothing."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shop.cards import card_ref
from shop.day import DAY
from shop.state import (
    CLAIM_SHARDS,
    DUPLICATE,
    ClaimShard,
    Send,
    ShopOrder,
    claim_key,
    claim_shard_keys,
    claims_tombstone_due,
    on_claims_cleanup,
    on_order,
    order_sends,
    outcome_sends,
    parse_shop_order,
)
from weir.tables.eof import on_batch, on_finish

SCREEN = "day/screen-1"
PROPERTY = settings(max_examples=200, deadline=None, database=None)


def _forward(order_id: str, line: int) -> list[Send]:
    order = ShopOrder(order_id, card_ref("4111111111111111", b"key"), {"mint": 2, "vanilla": 1}, 755)
    return order_sends(order, f"{SCREEN}/{line}", SCREEN, line, deadline_ms=1_000)


def _captures(sends: list[Send]) -> list[str]:
    return [send.key for send in sends if send.to == "payments" and send.value["kind"] == "capture"]


def test_the_first_line_takes_the_id_a_later_line_is_a_duplicate_and_a_redelivery_changes_nothing() -> None:
    claim, sends, refused = on_order(None, SCREEN, f"{SCREEN}/1", 1, "o-1", _forward("o-1", 1))
    assert claim.taken == {"o-1": (f"{SCREEN}/1", 1)}
    assert claim_key(SCREEN, "o-1") == f'["{SCREEN}",{claim.shard}]'
    assert ClaimShard.from_dict(claim.to_dict()) == claim
    assert refused is None
    assert _captures(sends) == [f"{SCREEN}/1"]
    assert sorted(send.to for send in sends) == ["dispatch", "payments"], "the kitchen is asked only after the capture"

    again, resent, refused = on_order(claim, SCREEN, f"{SCREEN}/1", 1, "o-1", _forward("o-1", 1))
    assert (again, resent, refused) == (claim, sends, None), "the same line again: the same sends, each idempotent downstream"

    kept, answer, refused = on_order(claim, SCREEN, f"{SCREEN}/2", 2, "o-1", _forward("o-1", 2))
    assert kept == claim
    assert _captures(answer) == [], "a duplicate is never charged"
    assert [send.to for send in answer] == ["outcomes", "eof-aggregate", "eof-counter"]
    outcome = answer[0].value
    assert (outcome["ticket"], outcome["line"], outcome["status"], outcome["amount_cents"]) == (f"{SCREEN}/2", 2, DUPLICATE, 0)
    assert "taken by line 1" in outcome["reason"]
    assert refused is not None
    assert "line 2" in refused
    assert "'o-1'" in refused


def test_a_claim_key_tells_screens_apart_whatever_they_hold_and_is_one_of_the_screen_s_shards() -> None:
    assert claim_key("day/a:b", "c") != claim_key("day/a", "b:c")
    assert claim_key("day/a/b", "c") != claim_key("day/a", "b/c")
    assert claim_key(SCREEN, "o-1") == claim_key(SCREEN, "o-1")
    keys = {claim_key(SCREEN, f"o-{number}") for number in range(2_000)}
    assert keys == set(claim_shard_keys(SCREEN)), "ids spread over every shard, and only over them: the cleanup reaches all"
    assert len(claim_shard_keys(SCREEN)) == CLAIM_SHARDS


def test_an_order_id_longer_than_the_limit_is_invalid() -> None:
    order, problem = parse_shop_order(
        '{"order_id": "' + "x" * 201 + '", "card": "4111", "items": [{"flavour": "mint", "size": "small"}]}', {"mint": 1}
    )
    assert order is None
    assert "201 characters long" in (problem or "")


def _day_totals(sends: list[Send], state: object = None) -> object:
    """The day's aggregate stage, fed the forwarded outcomes among ``sends``."""
    for send in sends:
        if send.to == "eof-aggregate":
            selected = [DAY.select(record) for record in send.value["records"]]
            state = on_batch(state, SCREEN, send.value["batch_id"], selected, 0, DAY).state  # type: ignore[arg-type]
    return state


def test_the_day_counts_a_duplicate_apart_from_invalid_and_aborted_lines() -> None:
    ready = {"ticket": f"{SCREEN}/1", "screen": SCREEN, "line": 1, "status": "ready", "reason": None, "amount_cents": 500}
    duplicate = {**ready, "ticket": f"{SCREEN}/2", "line": 2, "status": DUPLICATE, "reason": "duplicate order: ...", "amount_cents": 0}
    state = _day_totals([*outcome_sends(ready), *outcome_sends(duplicate), *outcome_sends(duplicate)])  # redelivered: once
    [flush] = on_finish(state, SCREEN, 2, 1, DAY).emits  # type: ignore[arg-type]
    totals = flush.value["totals"]
    assert (totals["lines"], totals["served"], totals["duplicate"], totals["invalid"], totals["aborted"]) == (2, 1, 1, 0, {})


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
    claims: dict[str, ClaimShard] = {}
    charged: dict[str, set[int]] = {}
    day: object = None
    for line, order_id in deliveries:
        key = claim_key(SCREEN, order_id)
        claim, sends, _ = on_order(claims.get(key), SCREEN, f"{SCREEN}/{line}", line, order_id, _forward(order_id, line))
        claims[key] = claim
        for ticket in _captures(sends):
            charged.setdefault(order_id, set()).add(int(ticket.rsplit("/", 1)[1]))
        day = _day_totals(sends, day)
    first_line = {order_id: ids.index(order_id) + 1 for order_id in set(ids)}
    assert charged == {order_id: {line} for order_id, line in first_line.items()}, "one charged line per id: its first"
    duplicates = len(ids) - len(set(ids))
    assert (day.totals["duplicate"] if day is not None else 0) == duplicates  # type: ignore[attr-defined]


def test_a_cleaned_up_shard_is_a_tombstone_that_answers_a_late_claim_and_then_goes() -> None:
    claim, _, _ = on_order(None, SCREEN, f"{SCREEN}/1", 1, "o-1", _forward("o-1", 1))
    key = claim_key(SCREEN, "o-1")
    tombstone = on_claims_cleanup(claim, key, 1_000)
    assert tombstone == ClaimShard(SCREEN, claim.shard, {}, closed_ms=1_000)
    assert on_claims_cleanup(tombstone, key, 2_000) is tombstone, "a second cleanup changes nothing"
    assert on_claims_cleanup(None, claim_shard_keys(SCREEN)[0], 1_000).closed_ms == 1_000, "an empty shard is closed too"
    kept, answer, refused = on_order(tombstone, SCREEN, f"{SCREEN}/9", 9, "o-1", _forward("o-1", 9))
    assert kept is tombstone
    assert _captures(answer) == [], "a claim after the day is never charged"
    assert answer[0].value["status"] == "invalid"
    assert refused is not None
    assert claims_tombstone_due(tombstone, 60_000) == 61_000
    assert claims_tombstone_due(claim, 60_000) is None
    assert ClaimShard.from_dict(tombstone.to_dict()) == tombstone
