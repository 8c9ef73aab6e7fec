"""The shop's payment gateway stage on weir's test driver: the worker's own stage code (shop.stages), no broker.

Two phases per order ticket (capture, then commit or void), each phase logged once on ``shop.transactions`` and
answered on ``shop.payment-answers``; a phase seen again changes nothing; a message that cannot be taken is
dead-lettered alone; a crash between a capture and its commit replays it to the same decision. A final payment's key
goes after the done retention (a capture still open stays), and a capture that comes again after that charges nothing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shop.cards import CardRef
from shop.settings import ShopSettings
from shop.stages import ShopStages
from shop.state import Capture
from weir import Settings, TestDriver

CARD = CardRef("tok_abc", "1111", True)
BAD_CARD = CardRef("tok_bad", "1112", False)  # failed the screen's Luhn check: the gateway rejects it


#: WEIR_DONE_RETENTION_MS of the expiry tests (the default is ten minutes)
RETENTION_MS = 5_000


def capture(order_id: str, card: CardRef = CARD, amount: int = 500, deadline_ms: int | None = None) -> dict[str, Any]:
    return Capture(order_id, amount, f"screen/1/{order_id}", card, deadline_ms).to_message()


def driver(reject_rate: float = 0.0, done_retention_ms: int = Settings.done_retention_ms) -> TestDriver:
    shop = ShopSettings(card_reject_rate=reject_rate, seed=7)
    settings = Settings(partitions=2, done_retention_ms=done_retention_ms)
    return TestDriver(settings=settings, topologies=[lambda wiring: ShopStages(wiring, shop)])


def phases(test: TestDriver) -> Counter[tuple[str, str]]:
    return Counter((record["order_id"], record["phase"]) for record in test.values("shop.transactions"))


def test_a_capture_then_a_commit_logs_each_phase_once_and_answers_the_dispatch() -> None:
    with driver() as test:
        test.pipe("shop.payments", capture("o-1"), key="o-1")
        test.pipe("shop.payments", {"kind": "commit", "order_id": "o-1"}, key="o-1")
        assert phases(test) == Counter({("o-1", "captured"): 1, ("o-1", "committed"): 1})
        assert test.values("shop.payment-answers") == [{"kind": "payment", "order_id": "o-1", "ok": True, "reason": None}]
        assert test.table("shop_payments")["o-1"]["state"] == "committed"
        assert test.dead_letters() == []


def test_a_phase_seen_again_changes_nothing_and_a_capture_seen_again_answers_the_same() -> None:
    with driver() as test:
        for message in (capture("o-1"), capture("o-1"), {"kind": "void", "order_id": "o-1"}, {"kind": "void", "order_id": "o-1"}):
            test.pipe("shop.payments", message, key="o-1")
        assert phases(test) == Counter({("o-1", "captured"): 1, ("o-1", "voided"): 1})
        assert [answer["ok"] for answer in test.values("shop.payment-answers")] == [True, True]
        assert test.table("shop_payments")["o-1"]["state"] == "voided"


def test_a_rejected_card_is_answered_no_and_its_void_settles_nothing() -> None:
    with driver() as test:
        test.pipe("shop.payments", capture("o-2", BAD_CARD), key="o-2")
        test.pipe("shop.payments", {"kind": "void", "order_id": "o-2"}, key="o-2")
        (answer,) = test.values("shop.payment-answers")
        assert (answer["ok"], "Luhn" in answer["reason"]) == (False, True)
        assert phases(test) == Counter({("o-2", "rejected"): 1})
        assert test.dead_letters() == []


def test_a_commit_without_a_capture_is_refused_alone_and_the_other_tickets_go_on() -> None:
    with driver() as test:
        test.pipe("shop.payments", {"kind": "commit", "order_id": "nobody"}, key="nobody", run=False)
        test.pipe("shop.payments", b"not json", key="o-3", run=False)
        test.pipe("shop.payments", {"kind": "refund", "order_id": "o-3"}, key="o-3", run=False)
        test.pipe("shop.payments", capture("o-4"), key="o-4")
        letters = {(letter["reason"], letter["agent"]): letter["error"] for letter in test.dead_letters()}
        assert set(letters) == {("rejected", "shop_payments"), ("undecodable", "shop_payments"), ("invalid", "shop_payments")}
        assert "has no capture to commit" in letters[("rejected", "shop_payments")]
        assert "'kind' must be 'capture', 'commit', 'void'" in letters[("invalid", "shop_payments")]
        assert phases(test) == Counter({("o-4", "captured"): 1}), "the ticket after them was captured"


@pytest.mark.parametrize("after", [1, 2, 3])
def test_a_crash_mid_batch_replays_the_captures_to_the_same_decisions(after: int) -> None:
    tickets = [f"o-{n}" for n in range(6)]
    with driver(reject_rate=0.5) as reference:
        for ticket in tickets:
            reference.pipe("shop.payments", capture(ticket), key=ticket)
        expected = reference.table("shop_payments")
    with driver(reject_rate=0.5) as test:
        for ticket in tickets:
            test.pipe("shop.payments", capture(ticket), key=ticket, run=False)
        test.crash_after(events=after)
        test.run()
        assert test.crashes == 1
        assert test.table("shop_payments") == expected
        assert sum(phases(test).values()) == len(tickets), f"one phase per ticket, read committed: {phases(test)}"
        assert 0 < sum(1 for payment in expected.values() if payment["state"] == "rejected") < len(tickets), "the draw rejects some"


def test_a_final_payment_goes_after_the_done_retention_and_an_open_capture_stays() -> None:
    with driver(done_retention_ms=RETENTION_MS) as test:
        deadline = test.clock.now_ms() + 1_000  # the order's, which the key outlives by the retention too
        for ticket, card in (("o-1", CARD), ("o-2", CARD), ("o-3", BAD_CARD)):
            test.pipe("shop.payments", capture(ticket, card, deadline_ms=deadline), key=ticket)
        test.pipe("shop.payments", {"kind": "commit", "order_id": "o-1"}, key="o-1")
        states = {ticket: payment["state"] for ticket, payment in test.table("shop_payments").items()}
        assert states == {"o-1": "committed", "o-2": "captured", "o-3": "rejected"}

        test.advance(ms=RETENTION_MS)  # the retention since the commit, not yet since the deadline
        assert set(test.table("shop_payments")) == {"o-1", "o-2", "o-3"}
        test.advance(ms=1_000 + 2 * test.settings.tick_interval_ms)
        assert {ticket: payment["state"] for ticket, payment in test.table("shop_payments").items()} == {"o-2": "captured"}

        test.advance(ms=10 * RETENTION_MS)
        assert set(test.table("shop_payments")) == {"o-2"}, "a capture still open never expires"
        test.pipe("shop.payments", {"kind": "void", "order_id": "o-2"}, key="o-2")
        assert test.table("shop_payments")["o-2"]["state"] == "voided"
        test.advance(ms=RETENTION_MS + 2 * test.settings.tick_interval_ms)
        assert test.table("shop_payments") == {}
        assert test.dead_letters() == []
        assert phases(test) == Counter(
            {("o-1", "captured"): 1, ("o-1", "committed"): 1, ("o-2", "captured"): 1, ("o-2", "voided"): 1, ("o-3", "rejected"): 1}
        )


def test_a_capture_delivered_again_after_its_payment_expired_charges_nothing() -> None:
    with driver(done_retention_ms=RETENTION_MS) as test:
        late = capture("o-1", deadline_ms=test.clock.now_ms() + 1_000)
        commit = {"kind": "commit", "order_id": "o-1"}
        test.pipe("shop.payments", late, key="o-1")
        test.pipe("shop.payments", commit, key="o-1")
        settled = test.table("shop_payments")["o-1"]
        test.advance(ms=3_000)
        for again in (late, commit):  # before the expiry: absorbed as ever, and the expiry is not put off
            test.pipe("shop.payments", again, key="o-1")
        assert test.table("shop_payments")["o-1"] == settled
        assert len(test.values("shop.payment-answers")) == 1, "a committed payment's capture seen again is not answered again"
        test.advance(ms=RETENTION_MS - 2_000 + 2 * test.settings.tick_interval_ms)
        assert "o-1" not in test.table("shop_payments")
        assert test.dead_letters() == []

        test.advance(ms=60_000)
        test.pipe("shop.payments", late, key="o-1")
        test.pipe("shop.payments", commit, key="o-1")
        assert phases(test) == Counter({("o-1", "captured"): 1, ("o-1", "committed"): 1}), "charged once"
        assert len(test.values("shop.payment-answers")) == 1, "the late capture is not answered"
        assert "o-1" not in test.table("shop_payments"), "nor kept"
        letters = {letter["reason"]: letter["error"] for letter in test.dead_letters()}
        assert set(letters) == {"late-capture", "rejected"}
        assert "nothing is captured" in letters["late-capture"]
        assert "has no capture to commit" in letters["rejected"]
