"""Cards: the Luhn check, tokens, masking, the gateway's decision, and the dispatch asking the kitchen only after capture."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from shop.cards import CardRef, card_ref, luhn_valid, mask_card_numbers, protect_line
from shop.settings import ShopSettings
from shop.stages import ShopStages
from shop.state import (
    CARD_DECLINED,
    CARD_INVALID,
    WAIT_COMPLETED,
    WAIT_TIMEOUT,
    Capture,
    DispatchOrder,
    OpenedOrder,
    Send,
    WaitEnd,
    card_accepted,
    decision_key,
    gateway_decision,
    on_capture,
    reservations,
    settle,
)
from weir import TestDriver
from weir.app.errors import redacted_dead_letter

PROPERTY = settings(max_examples=200, deadline=None, database=None)
KEY = b"run secret"
ORDER = DispatchOrder("t", "day/s", 1, OpenedOrder("t", {"mint": 2, "vanilla": 1}, 755))


def test_luhn_accepts_valid_numbers_and_refuses_a_mistyped_digit() -> None:
    for number in ("4111111111111111", "4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005", "6011111111111117"):
        assert luhn_valid(number), number
    for number in ("4111111111111112", "1234567812345678", "41111111111", "4111x11111111111", "", "٤١١١١١١١١١١١١١١١"):
        assert not luhn_valid(number), number


@PROPERTY
@given(number=st.from_regex(r"[0-9]{16}", fullmatch=True), position=st.integers(0, 15), delta=st.integers(1, 9))
def test_one_changed_digit_never_passes_twice(number: str, position: int, delta: int) -> None:
    changed = number[:position] + str((int(number[position]) + delta) % 10) + number[position + 1 :]
    assert not (luhn_valid(number) and luhn_valid(changed)), "Luhn catches every single-digit error"


def test_a_token_is_keyed_stable_and_holds_no_number() -> None:
    reference = card_ref("4111 1111 1111 1111", KEY)
    assert reference == card_ref("4111111111111111", KEY), "the same number, however grouped, the same token"
    assert reference.token != card_ref("4111111111111111", b"another run").token
    assert reference.token != card_ref("4242424242424242", KEY).token
    assert (reference.last4, reference.luhn_ok) == ("1111", True)
    assert reference.token.startswith("tok_")
    assert "4111" not in reference.token
    assert CardRef.from_dict(reference.to_dict()) == reference


def test_masking_keeps_the_last_four_digits_of_anything_that_looks_like_a_card() -> None:
    assert mask_card_numbers("pay 4111111111111111 now") == "pay ************1111 now"
    assert mask_card_numbers("4111 1111 1111 1111") == "**** **** **** 1111"
    assert mask_card_numbers("order 12345, 2 scoops") == "order 12345, 2 scoops", "short numbers are not cards"


def test_masking_finds_cards_written_with_dots_slashes_and_double_spaces() -> None:
    """Issue 37: these reached shop.orders, the dead letters and the dead-letters view in full."""
    assert mask_card_numbers("card 4758.3483.2677.5304") == "card ****.****.****.5304"
    assert mask_card_numbers("4758  3483  2677  5304") == "****  ****  ****  5304"
    assert mask_card_numbers("note: 4758/3483/2677/5304 thanks") == "note: ****/****/****/5304 thanks"
    assert mask_card_numbers("4758_3483\t2677-5304") == "****_****\t****-5304"
    assert mask_card_numbers("v1.2.3, 10/12/2026, 2 scoops") == "v1.2.3, 10/12/2026, 2 scoops", "dates and versions are no cards"


def test_a_protected_line_holds_the_reference_and_no_number() -> None:
    line = json.dumps({"order_id": "o-1", "card": "4111111111111111", "items": [{"flavour": "mint", "size": "small"}]})
    protected = protect_line(line, KEY)
    assert "4111111111111111" not in protected
    assert json.loads(protected)["card"] == card_ref("4111111111111111", KEY).to_dict()
    broken = '{"order_id": "o-1", "card": "4111111111111111", "items": ['
    assert protect_line(broken, KEY) == broken.replace("4111111111111111", "************1111"), "a broken line stays broken, masked"
    numeric = '{"order_id": "o-1", "card": 4111111111111111, "items": []}'
    assert "4111111111111111" not in protect_line(numeric, KEY)


def test_the_gateway_rejects_a_number_that_fails_luhn_and_draws_the_rest_by_seed() -> None:
    bad = card_ref("4111111111111112", KEY)
    good = card_ref("4111111111111111", KEY)
    assert gateway_decision(bad, "screen-1/1/o-1", seed=1, reject_rate=0.0) == CARD_INVALID
    assert gateway_decision(good, "screen-1/1/o-1", seed=1, reject_rate=0.0) is None
    assert gateway_decision(good, "screen-1/1/o-1", seed=1, reject_rate=1.0) == CARD_DECLINED
    keys = [decision_key(f"day/screen-{n % 3}", n, f"o-{n}") for n in range(3000)]
    draws = [gateway_decision(good, key, seed=7, reject_rate=0.2) for key in keys]
    assert draws == [gateway_decision(good, key, seed=7, reject_rate=0.2) for key in keys], "a replay decides the same"
    assert 0.17 < draws.count(CARD_DECLINED) / len(draws) < 0.23
    assert decision_key("monday/screen-1", 3, "o") == decision_key("tuesday/screen-1", 3, "o"), "the day does not change a fate"
    assert [draw is None for draw in draws] == [card_accepted(7, key, 0.2) for key in keys]


def test_a_capture_records_the_token_and_the_reason_never_the_number() -> None:
    capture = Capture("day/s/1", 500, "s/1/o-1", card_ref("4111111111111112", KEY))
    payment, sends = on_capture(None, Capture.from_message(capture.to_message()), 1, 0.0, now_ms=3)
    assert (payment.state, payment.reason, payment.card_last4) == ("rejected", CARD_INVALID, "1112")
    assert [send.to for send in sends] == ["transactions", "payment-answers"]
    assert sends[1].value == {"kind": "payment", "order_id": "day/s/1", "ok": False, "reason": CARD_INVALID}
    assert "4111111111111112" not in json.dumps([send.value for send in sends] + [payment.to_dict()])
    assert on_capture(payment, capture, 1, 0.0, now_ms=4) == (payment, [sends[1]]), "seen again: the same answer, no new log"


def _answered(ok: bool, reason: str | None = None) -> WaitEnd:
    return WaitEnd(WAIT_COMPLETED, ({"kind": "payment", "order_id": "t", "ok": ok, "reason": reason},))


NOTHING_ASKED = WaitEnd(WAIT_COMPLETED)


def test_a_rejected_card_is_aborted_without_a_word_to_the_kitchen() -> None:
    payment = _answered(False, CARD_DECLINED)
    assert reservations(ORDER, payment) == [], "nothing reserved for a rejected card"
    sends = settle(ORDER, payment, NOTHING_ASKED)
    assert [send.to for send in sends] == ["outcomes", "eof-aggregate", "eof-counter"], "no void of a capture never made, no release"
    assert (sends[0].value["status"], sends[0].value["reason"]) == ("aborted", CARD_DECLINED)


def _outcome(sends: list[Send]) -> dict[str, Any]:
    [outcome] = [send.value for send in sends if send.to == "outcomes"]
    return outcome


def test_a_captured_order_asks_the_kitchen_once_per_flavour_and_is_served_when_every_flavour_is_reserved() -> None:
    payment = _answered(True)
    asked = reservations(ORDER, payment)
    assert [(send.to, send.key, send.value["scoops"]) for send in asked] == [("kitchen", "mint", 2), ("kitchen", "vanilla", 1)]
    assert reservations(ORDER, payment) == asked, "the same answer asks the same (the kitchen answers a reservation once)"
    kitchen = WaitEnd(WAIT_COMPLETED, tuple({"order_id": "t", "flavour": flavour, "ok": True} for flavour in ("vanilla", "mint")))
    sends = settle(ORDER, payment, kitchen)
    assert [(send.to, send.value.get("kind")) for send in sends][:3] == [
        ("payments", "commit"),
        ("kitchen", "deliver"),
        ("kitchen", "deliver"),
    ]
    assert (_outcome(sends)["status"], _outcome(sends)["amount_cents"]) == ("ready", 755)


def test_a_refused_flavour_aborts_with_every_refusal_named_and_releases_every_flavour() -> None:
    kitchen = WaitEnd(
        WAIT_COMPLETED,
        ({"order_id": "t", "flavour": "vanilla", "ok": False}, {"order_id": "t", "flavour": "mint", "ok": False}),
    )
    sends = settle(ORDER, _answered(True), kitchen)
    assert [(send.to, send.key, send.value.get("kind")) for send in sends[:3]] == [
        ("payments", "t", "void"),
        ("kitchen", "mint", "release"),
        ("kitchen", "vanilla", "release"),
    ]
    assert _outcome(sends)["reason"] == "out of stock: mint; out of stock: vanilla"


def test_a_timeout_before_the_payment_answered_voids_and_reserves_nothing() -> None:
    payment = WaitEnd(WAIT_TIMEOUT, (), "timed out")
    assert reservations(ORDER, payment) == []
    sends = settle(ORDER, payment, NOTHING_ASKED)
    assert [(send.to, send.value.get("kind")) for send in sends] == [
        ("payments", "void"),
        ("outcomes", None),
        ("eof-aggregate", "batch"),
        ("eof-counter", "filtered"),
    ]
    assert sends[1].value["reason"] == "timeout waiting for payment"


def test_a_timeout_waiting_for_the_kitchen_voids_and_releases_what_was_asked() -> None:
    kitchen = WaitEnd(WAIT_TIMEOUT, ({"order_id": "t", "flavour": "mint", "ok": True},), "timed out")
    sends = settle(ORDER, _answered(True), kitchen)
    assert [(send.to, send.key) for send in sends[:3]] == [("payments", "t"), ("kitchen", "mint"), ("kitchen", "vanilla")]
    assert _outcome(sends)["reason"] == "timeout waiting for kitchen"


# ---------------------------------------------------------------------------------------------------
# The orders stage's dead letters go through its redaction (weir.app.shell.redact_dead_letters): any record, however broken.


def test_every_dead_letter_of_the_orders_stage_is_masked_whatever_the_record() -> None:
    card, other = "4539578763621486", "5555 5555 5555 4444"
    records = [
        ("day/s/1", f"pay with {card}".encode()),  # not JSON
        (f"raw-{card}", b"\xff\xfe not utf-8 " + card.encode()),  # not UTF-8: stored as base64
        ("day/s/2", orjson.dumps({"ticket": "day/s/2", "card": other})),  # JSON, not a screen's message
    ]
    with TestDriver(topologies=[lambda wiring: ShopStages(wiring, ShopSettings())]) as driver:
        for key, value in records:
            driver.pipe("shop.orders", value, key=key, headers={"h": card}, run=False)
        driver.run()
        letters = driver.dead_letters()
    sent = [(letter["key"]["text"].encode() if letter["key"]["text"] else b"", orjson.dumps(letter)) for letter in letters]
    assert len(sent) == len(records)
    for key, value in sent:
        letter = orjson.loads(value)
        stored = (key or b"") + b"|" + b"|".join(field_bytes for field_bytes in _bytes_of(letter))
        for number in (card, other.replace(" ", "")):
            assert number.encode() not in stored.replace(b" ", b""), letter
        assert b"1486" in stored or b"4444" in stored, "the last four digits stay"
    # another agent's dead letters are not touched
    plain = redacted_dead_letter({"key": {"text": "k"}, "value": {"text": card}, "headers": [], "error": ""}, lambda raw: raw)
    assert plain["value"] == {"text": card, "base64": None}


def _bytes_of(letter: dict[str, Any]) -> list[bytes]:
    fields = [letter["key"], letter["value"], *(raw for _, raw in letter["headers"])]
    found = [letter["error"].encode()]
    for field in fields:
        if field.get("text") is not None:
            found.append(field["text"].encode("utf-8", "surrogatepass"))
        elif field.get("base64") is not None:
            found.append(base64.b64decode(field["base64"]))
    return found
