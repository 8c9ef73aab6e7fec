"""Hostile order lines on the driver: one line never ends a screen; it gets its own outcome with a reason, and the
lines after it are served."""

from __future__ import annotations

from pathlib import Path

import orjson

from shop.cards import protect_line
from shop.screens import Screens, Unreadable, read_screen_lines
from tests.unit.shop.test_shop_day_driver import CARD_KEY, DAY_ID, serve_day, shop_driver

GOOD = '{"order_id": "ok-1", "card": "4556 7375 8689 9855", "items": [{"flavour": "vanilla", "size": "small"}]}'
#: valid JSON text whose order id decodes to a lone surrogate, which no UTF-8 record can hold
SURROGATE = GOOD.replace("ok-1", "s-\\udc80")


def test_a_line_with_an_escaped_lone_surrogate_stays_writable_once_its_card_is_protected() -> None:
    protected = protect_line(SURROGATE, CARD_KEY)
    protected.encode("utf-8")  # the screen writes it as a record: no UnicodeEncodeError, no TypeError in orjson
    assert "\\udc80" in protected
    assert "4556" not in protected


def test_a_line_with_a_lone_surrogate_is_answered_invalid_and_the_screen_goes_on() -> None:
    with shop_driver() as driver:
        reports = serve_day(driver, {"s1": [GOOD, SURROGATE, GOOD.replace("ok-1", "ok-2")]})
        outcomes = {outcome["ticket"].rsplit("/", 1)[-1]: outcome for outcome in driver.values("shop.outcomes")}
    assert [outcomes[line]["status"] for line in ("1", "2", "3")] == ["ready", "invalid", "ready"]
    assert "surrogates not allowed" in outcomes["2"]["reason"]
    assert (reports["s1"]["lines"], reports["s1"]["served"], reports["s1"]["invalid"]) == (3, 2, 1)


def test_a_line_that_is_not_utf8_is_answered_invalid_and_the_screen_goes_on(tmp_path: Path) -> None:
    """What the screens send for it (its size, sha256 and why), through the shop's stages on the driver."""
    path = tmp_path / "s1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"order_id": "\xff"}\n' + GOOD.replace("ok-1", "ok-2").encode() + b"\n")
    lines = read_screen_lines(path)
    screens = Screens("127.0.0.1:1", lambda name: name, card_key=CARD_KEY, max_record_bytes=100_000)  # its envelope only
    with shop_driver() as driver:
        for number, text in enumerate(lines, start=1):
            ticket = f"{DAY_ID}/s1/{number}"
            line = text if isinstance(text, Unreadable) else protect_line(text, CARD_KEY)
            driver.pipe("shop.orders", orjson.loads(screens.envelope(ticket, f"{DAY_ID}/s1", number, line)), key=ticket)
        outcomes = {outcome["ticket"].rsplit("/", 1)[-1]: outcome for outcome in driver.values("shop.outcomes")}
    assert [outcomes[line]["status"] for line in ("1", "2", "3")] == ["ready", "invalid", "ready"]
    assert outcomes["2"]["reason"].startswith("unreadable line: not UTF-8 text")
