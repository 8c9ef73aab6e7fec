"""The shop's pure cores run as a whole: random interleavings and redeliveries keep money and stock exact, and a
rejected card never reaches the kitchen."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shop.cards import CardRef, card_ref
from shop.day import DAY
from shop.flows import FLOWS
from shop.state import (
    Capture,
    Payment,
    Send,
    ShopOrder,
    Stock,
    card_accepted,
    on_capture,
    on_deliver,
    on_release,
    on_reserve,
    on_settle,
    order_sends,
    parse_shop_order,
)
from weir.app.flows import Exchange, Flow, validate_flows
from weir.tables.barrier import BarrierState, Release, Waiting, on_arrival, on_completion, on_tick, reported
from weir.tables.eof import (
    ClientJoin,
    ClientTotals,
    ControllerState,
    Emit,
    Totals,
    on_batch,
    on_finish,
    on_report,
    on_sent,
    on_side,
    on_totals,
)

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


#: The dispatch barriers' timeout in the simulation (a tick past it expires every wait).
TIMEOUT_MS = 10**6
#: The shop's flows as declared, by the topic each reads, and their barriers by name.
BY_SOURCE = validate_flows(FLOWS)
BARRIERS = {barrier.name: barrier for flow in FLOWS for barrier in flow.barriers()}


class Shop:
    """The cores wired as the agents and the dispatch flow wire them, over a bus that keeps each partition's order
    (per topic and key, as Kafka does) but interleaves partitions at random and delivers some messages twice.

    The dispatch is the shop's flows as declared (shop/flows.py), run step by step as the flow agents run them,
    with the barrier's core (tables/barrier.py) at each barrier: an open arrives at the payment's barrier; its
    release reserves and arrives at the kitchen's; that one's release settles. The answer flows' executions
    complete at the barriers that await them, with their part and their answer as result.
    """

    def __init__(self, rng: random.Random, stock: int, reject_rate: float) -> None:
        self.rng = rng
        self.payments: dict[str, Payment] = {}
        self.stock = {flavour: Stock(flavour, available=stock, initial=stock) for flavour in CATALOGUE}
        self.barriers: dict[tuple[str, str], BarrierState | None] = {}
        #: the screen's day in the end-of-stream stages (shop/day.py): controller, aggregate, join
        self.counter: ControllerState | None = None
        self.day: ClientTotals | None = None
        self.join: ClientJoin | None = None
        #: one queue per partition (topic, key): a queue's head is the next message that partition delivers
        self.queues: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.final_reports: list[dict[str, Any]] = []
        self.transactions: list[dict[str, Any]] = []
        #: orders the kitchen was asked to reserve for
        self.reservations: set[str] = set()
        self.reject_rate = reject_rate
        #: (flavour, order) the kitchen delivered or released (table shop_kitchen_settled)
        self.settled: set[tuple[str, str]] = set()
        self.now = 0

    def waiting(self) -> list[str]:
        return [waiting.exchange_id for state in self.barriers.values() if state is not None for waiting in state.waiting]

    @property
    def busy(self) -> bool:
        return any(self.queues.values())

    def post(self, to: str, key: str, value: dict[str, Any], *, again: bool = True) -> None:
        queue = self.queues.setdefault((to, key), [])
        queue.append(value)
        if again and self.rng.random() < 0.2:
            queue.append(value)  # redelivered

    def send(self, sends: list[Send]) -> None:
        for send in sends:
            if send.to == "outcomes":
                self.outcomes.append(send.value)
            elif send.to == "reports":
                self.final_reports.append(send.value)
            elif send.to == "transactions":
                self.transactions.append(send.value)
            else:
                self.post(send.to, send.key, send.value)

    def order(self, ticket: str, order: ShopOrder) -> None:
        # the orders stage's sends are sent again too (at_least_once replays it): an open or a capture may come twice
        self.send(order_sends(order, ticket, "s", int(ticket), deadline_ms=TIMEOUT_MS))

    def run(self, flow: Flow, exchange: Exchange, exchange_id: str, start: int) -> None:
        """``flow``'s steps from ``start``, as the flow agent runs them: process, to (each record keyed by its key),
        and a barrier, where the exchange arrives on the barrier's topic (keyed as it waits) and the run stops."""
        for index in range(start, len(flow.steps)):
            step = flow.steps[index]
            if step.kind == "process":
                assert step.function is not None
                value = step.function(exchange)
                if value is not None:
                    exchange.payload = value
            elif step.kind == "to":
                assert step.topic is not None
                payloads = step.each(exchange) if step.each is not None else [exchange.payload]
                for payload in payloads:
                    key = step.key(Exchange(payload=payload)) if step.key is not None else exchange.key
                    assert key is not None
                    self.send([Send(step.topic.removeprefix("shop."), key, payload)])
            elif step.kind == "barrier":
                barrier = step.barrier
                assert barrier is not None
                awaited = tuple(BY_SOURCE[item.source].name for item in barrier.awaits)
                key = barrier.key_for(barrier.awaits[0])(exchange)
                assert key is not None
                expected = {BY_SOURCE[item.source].name: item.count(exchange) for item in barrier.awaits if callable(item.count)}
                waiting = Waiting(exchange_id, flow.name, self.now, self.now + TIMEOUT_MS, awaited, exchange.to_dict(), index + 1)
                self.post(f"barrier:{barrier.name}", key, {"kind": "arrival", "waiting": replace(waiting, expected=expected)})
                return
            else:
                raise AssertionError(f"the simulation runs no {step.kind} step")

    def execute(self, source: str, key: str, value: dict[str, Any]) -> None:
        """A record on ``source``: an execution of the flow that reads it (its id from ``id_by``); an answer flow's
        execution ends completed, and its completion goes to every barrier awaiting it, with its part and result."""
        flow = BY_SOURCE[source]
        exchange = Exchange(payload=value, key=key)
        identity = flow.id_by(exchange) if flow.id_by is not None else None
        entry = Exchange(payload=dict(value), key=key)  # keys and parts are read on entry, before any step
        self.run(flow, exchange, f"{flow.name}:{identity}", 0)
        if any(step.kind == "barrier" for step in flow.steps):
            return
        for waiting_flow in FLOWS:
            for barrier in waiting_flow.barriers():
                for item in barrier.awaits:
                    if item.source != source:
                        continue
                    part = item.distinct_by(entry) if item.distinct_by is not None else None
                    message = {"kind": "completion", "flow": flow.name, "result": exchange.payload if item.results else None, "part": part}
                    self.post(f"barrier:{barrier.name}", str(barrier.key_for(item)(entry)), message)

    def at_barrier(self, name: str, key: str, message: dict[str, Any]) -> None:
        barrier = BARRIERS[name]
        previous = self.barriers.get((name, key))
        if message["kind"] == "arrival":
            rules = {"on_duplicate": barrier.on_duplicate, "on_failure": barrier.on_failure}
            transition = on_arrival(previous, key, message["waiting"], name, self.now, **rules)
        else:
            transition = on_completion(
                previous,
                key,
                message["flow"],
                "completed",
                None,
                TIMEOUT_MS,
                name,
                self.now,
                result=message["result"],
                part=message["part"],
                on_failure=barrier.on_failure,
            )
        self.barriers[(name, key)] = transition.state
        assert not transition.failures, transition.failures
        self.release(name, key, transition.releases)

    def release(self, name: str, key: str, releases: tuple[Release, ...]) -> None:
        for release in releases:
            message = {"exchange": reported(release, name), "exchange_id": release.waiting.exchange_id, "step": release.waiting.resume_step}
            self.post("resume", key, message, again=False)

    def step(self) -> None:
        self.now += 1
        (to, key), queue = self.rng.choice([(partition, queue) for partition, queue in self.queues.items() if queue])
        value = queue.pop(0)
        if to == "payments":
            previous = self.payments.get(key)
            if value["kind"] == "capture":
                payment, sends = on_capture(previous, Capture.from_message(value), 1, self.reject_rate, self.now)
                self.payments[key] = payment
            else:
                settled, sends, error = on_settle(previous, key, value["kind"] == "commit", self.now)
                assert error is None, error
                assert settled is not None
                self.payments[key] = settled
            self.send(sends)
        elif to == "kitchen":
            stock = self.stock[key]
            mark = (key, value["order_id"])
            if value["kind"] == "reserve":
                self.reservations.add(value["order_id"])
                stock, sends = on_reserve(stock, value["order_id"], value["scoops"], settled=mark in self.settled)
                self.send(sends)
            else:
                stock = on_release(stock, value["order_id"]) if value["kind"] == "release" else on_deliver(stock, value["order_id"])
                self.settled.add(mark)
            assert stock.available >= 0
            self.stock[key] = stock
        elif f"shop.{to}" in BY_SOURCE:
            self.execute(f"shop.{to}", key, value)
        elif to.startswith("barrier:"):
            self.at_barrier(to.split(":", 1)[1], key, value)
        elif to == "resume":
            self.run(BY_SOURCE["shop.dispatch"], Exchange.from_dict(value["exchange"]), value["exchange_id"], value["step"])
        elif to == "eof-counter":
            if value["kind"] == "sent":
                counted = on_sent(self.counter, key, value["batches"], self.now)
            else:
                counted = on_report(self.counter, key, value["batch_id"], value["forwarded"], self.now)
            assert counted.rejected is None, counted.rejected
            self.counter = counted.state
            self.emit(key, counted.emits)
        elif to == "eof-aggregate":
            if value["kind"] == "finish":
                merged = on_finish(self.day, key, value["expected"], self.now, DAY)
            else:
                records = [DAY.select(record) for record in value["records"]]
                merged = on_batch(self.day, key, value["batch_id"], records, self.now, DAY)
            assert merged.rejected is None, merged.rejected
            self.day = merged.state
            self.emit(key, merged.emits)
        elif to == "eof-join":
            if value["kind"] == "side":
                joined = on_side(self.join, key, value["side"], self.now, DAY)
            else:
                joined = on_totals(self.join, key, Totals.from_dict(value), self.now, DAY)
            assert joined.rejected is None, joined.rejected
            self.join = joined.state
            self.emit(key, joined.emits)

    def emit(self, client: str, emits: list[Emit]) -> None:
        """The end-of-stream cores' messages, on the bus like the shop's (``reports``: the screen's report)."""
        for emit in emits:
            if emit.to == "reports":
                self.final_reports.append(emit.value)
            else:
                self.post(f"eof-{emit.to}", client, emit.value)

    def tick(self) -> None:
        for (name, key), state in list(self.barriers.items()):
            transition = on_tick(state, name, self.now, on_timeout=BARRIERS[name].on_timeout)
            self.barriers[(name, key)] = transition.state
            assert not transition.failures, transition.failures
            self.release(name, key, transition.releases)


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
        shop.order(str(number), ShopOrder(f"o-{number}", CARD, scoops, amount))
    steps = 0
    while shop.busy:
        shop.step()
        steps += 1
        if timeout_after is not None and steps == timeout_after:
            shop.now += TIMEOUT_MS  # every wait's deadline passes with answers still in flight
            shop.tick()
    if timeout_after is None:
        assert not shop.waiting(), "every order went through both barriers without a timeout"
    for _ in range(3):  # later ticks: an open that came after its answer was forgotten waits out its own timeout
        shop.now += TIMEOUT_MS
        shop.tick()
        while shop.busy:
            shop.step()
    # The screen's end of day: its side data (none: the catalogue's prices) and "sent N", then the stages settle.
    shop.post("eof-join", "s", {"kind": "side", "client": "s", "side": None})
    shop.post("eof-counter", "s", {"kind": "sent", "client": "s", "batches": orders})
    while shop.busy:
        shop.step()

    tickets = [outcome["ticket"] for outcome in shop.outcomes]
    assert sorted(tickets, key=int) == [str(number) for number in range(1, orders + 1)], "one outcome per order"
    assert not shop.waiting(), "no order still waits"
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
    assert len(shop.final_reports) == 1, "one report of the day, whatever was redelivered"
    [report] = shop.final_reports
    assert report["status"] == "complete"
    assert report["lines"] == orders
    assert report["served"] == sum(1 for outcome in shop.outcomes if outcome["status"] == "ready")
    assert report["revenue_cents"] == committed
    assert sum(entry["scoops"] for entry in report["flavours"].values()) == sum(
        sum(outcome["scoops"].values()) for outcome in shop.outcomes if outcome["status"] == "ready"
    )
