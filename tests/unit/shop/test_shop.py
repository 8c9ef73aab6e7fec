"""The shop's pure cores run as a whole: random interleavings and redeliveries keep money and stock exact, and a
rejected card never reaches the kitchen."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tables.shop import (
    Capture,
    Dispatch,
    DispatchDone,
    DispatchState,
    OpenedOrder,
    Payment,
    ScreenReport,
    Send,
    ShopOrder,
    Stock,
    card_accepted,
    on_capture,
    on_deliver,
    on_dispatch_tick,
    on_end,
    on_kitchen,
    on_open,
    on_outcome,
    on_payment,
    on_release,
    on_reserve,
    on_settle,
    order_sends,
    parse_shop_order,
)
from tables.shop_cards import CardRef, card_ref

KEY = b"test key"
CARD = card_ref("4111 1111 1111 1111", KEY)

CATALOGUE = {"vanilla": 250, "mint": 255, "pistachio": 320}
PROPERTY = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def test_parse_shop_order_prices_sizes_and_names_what_is_wrong() -> None:
    line = json.dumps(
        {"order_id": "o1", "card": "4111", "items": [{"flavour": "mint", "size": "large"}, {"flavour": "mint", "size": "small"}]}
    )
    order, problem = parse_shop_order(line, CATALOGUE, KEY)
    assert problem is None
    assert order == ShopOrder("o1", card_ref("4111", KEY), {"mint": 4}, 4 * 255)
    referenced = json.dumps({"order_id": "o1", "card": CARD.to_dict(), "items": [{"flavour": "mint", "size": "small"}]})
    assert parse_shop_order(referenced, CATALOGUE) == (ShopOrder("o1", CARD, {"mint": 1}, 255), None)
    for bad, reason in [
        ("{", "broken line"),
        (json.dumps({"order_id": "o", "card": "c", "items": [{"flavour": "durian", "size": "small"}]}), "unknown flavour 'durian'"),
        (json.dumps({"order_id": "o", "card": "c", "items": [{"flavour": "mint", "size": "huge"}]}), "unknown size 'huge'"),
        (json.dumps({"order_id": "o", "items": [{"flavour": "mint", "size": "small"}]}), "'card' must be"),
        (json.dumps({"order_id": "o", "card": {"token": "x"}, "items": [{"flavour": "mint", "size": "small"}]}), "a card reference"),
    ]:
        assert parse_shop_order(bad, CATALOGUE)[0] is None
        assert reason in (parse_shop_order(bad, CATALOGUE)[1] or "")


def test_card_decisions_depend_on_seed_and_order_only() -> None:
    decisions = [card_accepted(7, f"o{n}", 0.3) for n in range(2000)]
    assert decisions == [card_accepted(7, f"o{n}", 0.3) for n in range(2000)]
    assert 0.25 < decisions.count(False) / 2000 < 0.35
    assert decisions != [card_accepted(8, f"o{n}", 0.3) for n in range(2000)]


def _capture(order_id: str, amount: int = 500, card: CardRef = CARD) -> Capture:
    return Capture(order_id, amount, f"screen-1/1/{order_id}", card)


def test_settle_is_idempotent_and_refuses_impossible_transitions() -> None:
    captured, _ = on_capture(None, _capture("t"), 1, 0.0, now_ms=0)
    committed, sends, error = on_settle(captured, "t", True, now_ms=1)
    assert error is None
    assert committed is not None
    assert committed.state == "committed"
    assert [send.value["phase"] for send in sends] == ["committed"]
    assert on_settle(committed, "t", True, now_ms=2)[1:] == ([], None)
    assert "cannot become voided" in (on_settle(committed, "t", False, now_ms=2)[2] or "")
    rejected, _ = on_capture(None, _capture("r"), 1, 1.0, now_ms=0)
    assert on_settle(rejected, "r", False, now_ms=1)[1:] == ([], None)
    assert on_capture(committed, _capture("t", 999), 1, 1.0, now_ms=5) == (committed, [])


def test_stock_never_goes_below_zero_and_refusal_is_remembered() -> None:
    stock = Stock("mint", available=3, initial=3)
    stock, sends = on_reserve(stock, "a", 2)
    assert sends[0].value["ok"] is True
    stock, sends = on_reserve(stock, "b", 2)
    assert sends[0].value["ok"] is False
    assert sends[0].value["reason"] == "out of stock: mint"
    assert stock.available == 1
    again, sends = on_reserve(stock, "b", 2)
    assert again == stock
    assert sends[0].value["ok"] is False
    stock = on_release(stock, "a")
    assert stock.available == 3
    assert on_deliver(stock, "a") == stock


class Shop:
    """The cores wired as the agents wire them, with a message bus that delivers in any order, some twice."""

    def __init__(self, rng: random.Random, stock: int, reject_rate: float) -> None:
        self.rng = rng
        self.payments: dict[str, Payment] = {}
        self.stock = {flavour: Stock(flavour, available=stock, initial=stock) for flavour in CATALOGUE}
        self.dispatch: dict[str, DispatchState] = {}
        self.reports: dict[str, ScreenReport] = {}
        self.bus: list[Send] = []
        self.outcomes: list[dict[str, Any]] = []
        self.final_reports: list[dict[str, Any]] = []
        self.transactions: list[dict[str, Any]] = []
        #: orders the kitchen was asked to reserve for
        self.reservations: set[str] = set()
        self.reject_rate = reject_rate
        #: (flavour, order) the kitchen delivered or released (table shop_kitchen_settled)
        self.settled: set[tuple[str, str]] = set()
        self.now = 0

    def send(self, sends: list[Send]) -> None:
        for send in sends:
            if send.to == "outcomes":
                self.outcomes.append(send.value)
            elif send.to == "reports":
                self.final_reports.append(send.value)
            elif send.to == "transactions":
                self.transactions.append(send.value)
            else:
                self.bus.append(send)
                if self.rng.random() < 0.2:
                    self.bus.append(send)  # redelivered

    def order(self, ticket: str, order: ShopOrder, deadline_ms: int) -> None:
        # the orders stage's sends are redelivered too (at_least_once replays it): an open or a capture may come again
        self.send(order_sends(order, ticket, "s", int(ticket), deadline_ms))

    def step(self) -> None:
        self.now += 1
        message = self.bus.pop(self.rng.randrange(len(self.bus)))
        value = message.value
        if message.to == "payments":
            previous = self.payments.get(message.key)
            if value["kind"] == "capture":
                payment, sends = on_capture(previous, Capture.from_message(value), 1, self.reject_rate, self.now)
                self.payments[message.key] = payment
            else:
                settled, sends, error = on_settle(previous, message.key, value["kind"] == "commit", self.now)
                assert error is None, error
                assert settled is not None
                self.payments[message.key] = settled
            self.send(sends)
        elif message.to == "kitchen":
            stock = self.stock[message.key]
            mark = (message.key, value["order_id"])
            if value["kind"] == "reserve":
                self.reservations.add(value["order_id"])
                stock, sends = on_reserve(stock, value["order_id"], value["scoops"], settled=mark in self.settled)
                self.send(sends)
            else:
                stock = on_release(stock, value["order_id"]) if value["kind"] == "release" else on_deliver(stock, value["order_id"])
                self.settled.add(mark)
            assert stock.available >= 0
            self.stock[message.key] = stock
        elif message.to == "dispatch":
            previous = self.dispatch.get(message.key)
            if value["kind"] == "open":
                raw = value["order"]
                opened = OpenedOrder(value["order_id"], raw["scoops"], raw["amount_cents"])  # as the agent: by ticket
                state, sends = on_open(previous, opened, message.key, "s", value["line"], value["deadline_ms"], self.now)
            elif value["kind"] == "kitchen":
                state, sends = on_kitchen(previous, message.key, value["flavour"], value["ok"], self.now)
            else:
                state, sends = on_payment(previous, message.key, value["ok"], self.now, value["reason"])
            self.dispatch[message.key] = state
            self.send(sends)
        elif message.to == "screens":
            report, sends = on_outcome(self.reports.get("s"), "s", value["line"], value["status"], value["reason"], value["amount_cents"])
            self.reports["s"] = report
            self.send(sends)

    def tick(self) -> None:
        for ticket, state in list(self.dispatch.items()):
            updated, sends = on_dispatch_tick(state, self.now, done_retention_ms=10**9, placeholder_timeout_ms=10**9)
            assert updated is not None
            self.dispatch[ticket] = updated
            self.send(sends)


@PROPERTY
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    orders=st.integers(min_value=1, max_value=25),
    stock=st.integers(min_value=0, max_value=30),
    reject_rate=st.sampled_from([0.0, 0.2, 1.0]),
    timeout_after=st.sampled_from([None, 5, 40]),
)
def test_every_order_ends_once_and_money_and_stock_balance(
    seed: int, orders: int, stock: int, reject_rate: float, timeout_after: int | None
) -> None:
    rng = random.Random(seed)
    shop = Shop(rng, stock, reject_rate)
    for number in range(1, orders + 1):
        scoops = {flavour: rng.randint(1, 3) for flavour in rng.sample(sorted(CATALOGUE), rng.randint(1, 3))}
        amount = sum(CATALOGUE[flavour] * count for flavour, count in scoops.items())
        shop.order(str(number), ShopOrder(f"o-{number}", CARD, scoops, amount), deadline_ms=10**9)
    steps = 0
    while shop.bus:
        shop.step()
        steps += 1
        if timeout_after is not None and steps == timeout_after:
            shop.now = 10**9  # every deadline passes with answers still in flight
            shop.tick()
    _report, sends = on_end(shop.reports.get("s"), "s", orders)
    shop.send(sends)

    tickets = [outcome["ticket"] for outcome in shop.outcomes]
    assert sorted(tickets, key=int) == [str(number) for number in range(1, orders + 1)], "one outcome per order"
    assert all(isinstance(shop.dispatch[ticket], DispatchDone) for ticket in tickets)
    assert not any(isinstance(state, Dispatch) for state in shop.dispatch.values())
    for ticket, payment in shop.payments.items():
        outcome = next(outcome for outcome in shop.outcomes if outcome["ticket"] == ticket)
        expected = {"ready": "committed"}.get(outcome["status"], "voided" if payment.state != "rejected" else "rejected")
        assert payment.state == expected, (ticket, payment, outcome)
    captured = sum(p.amount_cents for p in shop.payments.values() if p.state in ("committed", "voided"))
    committed = sum(p.amount_cents for p in shop.payments.values() if p.state == "committed")
    voided = sum(p.amount_cents for p in shop.payments.values() if p.state == "voided")
    assert captured == committed + voided
    assert committed == sum(outcome["amount_cents"] for outcome in shop.outcomes)
    for container in shop.stock.values():
        assert container.reserved == {}, f"{container.flavour}: scoops still reserved after every order ended"
        assert container.initial - container.delivered == container.available
    rejected = {ticket for ticket, payment in shop.payments.items() if payment.state == "rejected"}
    assert not rejected & shop.reservations, "a rejected card's order reached the kitchen"
    if timeout_after is None:  # (a deadline may pass before the gateway's answer: that order timed out)
        assert all(outcome["reason"].startswith("card rejected") for outcome in shop.outcomes if outcome["ticket"] in rejected)
    assert len(shop.final_reports) == 1
    assert shop.final_reports[0]["served"] == sum(1 for outcome in shop.outcomes if outcome["status"] == "ready")
    assert shop.final_reports[0]["revenue_cents"] == committed
