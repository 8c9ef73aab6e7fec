"""The kitchen's settled marks expire, and a reservation that comes after its order's mark went reserves nothing: a mark
is kept the done retention after its release or delivery and after its order's deadline; a reservation that finds
neither mark nor order once that deadline and the retention have passed is refused as late (the pure core,
shop/state.py; the stage on the test driver: tests/unit/shop/test_kitchen_stage.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shop.cards import CardRef
from shop.state import (
    WAIT_COMPLETED,
    WAIT_TIMEOUT,
    Capture,
    DispatchOrder,
    Payment,
    Stock,
    WaitEnd,
    done_due,
    kitchen_mark,
    late_capture,
    late_reservation,
    on_deliver,
    on_release,
    on_reserve,
    past_done_retention,
    payment_due,
    reservations,
    settle,
)

PROPERTY = settings(max_examples=300, deadline=None, database=None)
RETENTION_MS = 600_000
#: the order's deadline, as the claims stage gives its open (and the dispatch its reservations, releases, deliveries)
DEADLINE_MS = 30_000
ORDER = "day/s/1"


def _stock(available: int = 10) -> Stock:
    return Stock("mint", available=available, initial=available)


def _late(stock: Stock, now_ms: int, *, deadline_ms: int | None = DEADLINE_MS, settled: bool = False) -> str | None:
    return late_reservation(stock, ORDER, deadline_ms, now_ms, RETENTION_MS, settled=settled)


def test_a_reservation_after_its_deadline_and_the_retention_finding_no_mark_and_no_order_is_refused() -> None:
    stock = _stock()
    assert _late(stock, DEADLINE_MS + RETENTION_MS - 1) is None, "late for the dispatch, still taken"
    refused = _late(stock, DEADLINE_MS + RETENTION_MS)
    assert refused is not None
    assert "'day/s/1'" in refused
    assert "(mint)" in refused
    assert "nothing is reserved or answered" in refused
    assert _late(stock, 10**15, deadline_ms=None) is None, "a reservation without a deadline is never late"


def test_the_hole_a_reservation_after_its_mark_expired_would_hold_scoops_for_a_settled_order() -> None:
    """What the rule closes: once the mark went, the core alone takes the reservation again as a first one."""
    stock, _ = on_reserve(_stock(), ORDER, 3)
    stock = on_deliver(stock, ORDER)
    assert (stock.available, stock.reserved, stock.delivered) == (7, {}, 3)
    again, sends = on_reserve(stock, ORDER, 3, settled=False)  # the mark expired: nothing says the order settled
    assert again.reserved == {ORDER: 3}, "scoops held that no release or delivery will come for"
    assert len(sends) == 1
    assert _late(stock, DEADLINE_MS + RETENTION_MS) is not None, "refused before it reaches on_reserve"


def test_a_reservation_that_finds_its_mark_or_its_order_is_never_late() -> None:
    late = DEADLINE_MS + 10 * RETENTION_MS
    assert _late(_stock(), late, settled=True) is None, "the mark absorbs it, as ever"
    held, _ = on_reserve(_stock(), ORDER, 3)
    assert _late(held, late) is None, "scoops held: their release or delivery is still to come"
    assert on_reserve(held, ORDER, 3)[0] == held, "and it is answered again, reserving nothing more"
    refused, _ = on_reserve(_stock(available=1), ORDER, 3)
    assert ORDER in refused.refused
    assert _late(refused, late) is None
    again, sends = on_reserve(refused, ORDER, 3)
    assert again == refused
    assert [send.value["ok"] for send in sends] == [False]


def test_a_mark_counts_its_retention_from_its_settle_or_its_order_s_deadline_whichever_is_later() -> None:
    assert kitchen_mark(2_000, DEADLINE_MS) == DEADLINE_MS, "settled before the deadline: kept from the deadline"
    assert kitchen_mark(45_000, DEADLINE_MS) == 45_000
    assert kitchen_mark(45_000, None) == 45_000, "a release without a deadline: from the release, as before"
    for settled_ms in (0, 2_000, DEADLINE_MS, 45_000, 10**9):
        since = kitchen_mark(settled_ms, DEADLINE_MS)
        assert since + RETENTION_MS == done_due(settled_ms, DEADLINE_MS, RETENTION_MS)
        assert since + RETENTION_MS >= DEADLINE_MS + RETENTION_MS, "the mark is there until the rule takes over"
        assert past_done_retention(DEADLINE_MS, since + RETENTION_MS, RETENTION_MS), "once it goes, the rule refuses"


def test_the_kitchen_s_rule_and_the_payments_rule_are_one() -> None:
    capture = Capture(ORDER, 500, "s/1/o-1", CardRef("tok_abc", "1111", True), DEADLINE_MS)
    for now in (DEADLINE_MS + RETENTION_MS - 1, DEADLINE_MS + RETENTION_MS, DEADLINE_MS + 2 * RETENTION_MS):
        late = past_done_retention(DEADLINE_MS, now, RETENTION_MS)
        assert (late_capture(None, capture, now, RETENTION_MS) is not None) == late
        assert (_late(_stock(), now) is not None) == late
    payment = Payment(ORDER, 500, "committed", 2_000, deadline_ms=DEADLINE_MS)
    assert payment_due(payment, RETENTION_MS) == done_due(2_000, DEADLINE_MS, RETENTION_MS) == DEADLINE_MS + RETENTION_MS


def _open(deadline_ms: object = DEADLINE_MS) -> dict[str, object]:
    opened: dict[str, object] = {
        "kind": "open",
        "order_id": ORDER,
        "ticket": ORDER,
        "screen": "day/s",
        "line": 1,
        "order": {"order_id": "o-1", "scoops": {"mint": 1, "lemon": 2}, "amount_cents": 900},
    }
    if deadline_ms is not None:
        opened["deadline_ms"] = deadline_ms
    return opened


CAPTURED = WaitEnd(WAIT_COMPLETED, ({"kind": "payment", "order_id": ORDER, "ok": True, "reason": None},))


def test_every_message_the_dispatch_sends_the_kitchen_carries_its_order_s_deadline() -> None:
    order = DispatchOrder.from_open(_open())
    assert order.deadline_ms == DEADLINE_MS
    reserve = reservations(order, CAPTURED)
    assert [(send.key, send.value) for send in reserve] == [
        ("lemon", {"kind": "reserve", "order_id": ORDER, "flavour": "lemon", "scoops": 2, "deadline_ms": DEADLINE_MS}),
        ("mint", {"kind": "reserve", "order_id": ORDER, "flavour": "mint", "scoops": 1, "deadline_ms": DEADLINE_MS}),
    ]
    answers = tuple({"kind": "kitchen", "order_id": ORDER, "flavour": flavour, "ok": True, "reason": None} for flavour in ("lemon", "mint"))
    for kitchen, kind in ((WaitEnd(WAIT_COMPLETED, answers), "deliver"), (WaitEnd(WAIT_TIMEOUT), "release")):
        to_kitchen = [send.value for send in settle(order, CAPTURED, kitchen) if send.to == "kitchen"]
        assert [(value["kind"], value["flavour"], value["deadline_ms"]) for value in to_kitchen] == [
            (kind, "lemon", DEADLINE_MS),
            (kind, "mint", DEADLINE_MS),
        ]


def test_an_open_without_a_deadline_sends_the_kitchen_none_and_a_bad_one_is_refused() -> None:
    legacy = DispatchOrder.from_open(_open(None))
    assert legacy.deadline_ms is None
    assert all("deadline_ms" not in send.value for send in reservations(legacy, CAPTURED))
    assert all("deadline_ms" not in send.value for send in settle(legacy, CAPTURED, WaitEnd(WAIT_TIMEOUT)) if send.to == "kitchen")
    for bad in ("30000", True, 1.5):
        with pytest.raises(ValueError, match="'deadline_ms' must be an integer"):
            DispatchOrder.from_open(_open(bad))


@dataclass
class Kitchen:
    """The kitchen stage for one flavour, as shop/stages/kitchen.py runs it: the container, the settled marks (order ->
    the instant their retention counts from) with their filed deadlines, and what it did."""

    retention_ms: int
    stock: Stock
    marks: dict[str, int] = field(default_factory=dict)
    filed: list[tuple[int, str]] = field(default_factory=list)
    #: times scoops were taken for each order
    taken: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    refused_late: list[tuple[str, int]] = field(default_factory=list)

    def reserve(self, order: str, scoops: int, deadline_ms: int, now: int) -> None:
        settled = order in self.marks
        if late_reservation(self.stock, order, deadline_ms, now, self.retention_ms, settled=settled) is not None:
            self.refused_late.append((order, now))
            return
        held = order in self.stock.reserved
        self.stock, sends = on_reserve(self.stock, order, scoops, settled=settled)
        if order in self.stock.reserved and not held:
            self.taken[order] += 1
        self.answers[order] += len(sends)

    def settle(self, order: str, kind: str, deadline_ms: int, now: int) -> None:
        self.stock = on_release(self.stock, order) if kind == "release" else on_deliver(self.stock, order)
        if order not in self.marks:
            self.marks[order] = kitchen_mark(now, deadline_ms)
            self.filed.append((self.marks[order] + self.retention_ms, order))

    def tick(self, now: int) -> list[str]:
        """The deadline index's walk: each mark filed due by now whose retention has passed goes. Returns those."""
        gone = []
        for due, order in [entry for entry in self.filed if entry[0] <= now]:
            self.filed.remove((due, order))
            since = self.marks.get(order)
            if since is not None and since + self.retention_ms <= now:
                del self.marks[order]
                gone.append(order)
        return gone


@dataclass
class Order:
    """One order's part in the flavour's partition: its deadline, scoops, how it ends, and what reached the kitchen."""

    scoops: int
    slack_ms: int
    abort: bool
    deadline_ms: int | None = None
    first_reserved_ms: int | None = None
    settled_ms: int | None = None
    settle_kind: str | None = None


ORDERS = st.lists(
    st.builds(
        Order,
        scoops=st.integers(min_value=1, max_value=3),
        # the deadline after the first reservation (a reservation comes before its deadline, as a rule) or before it
        slack_ms=st.one_of(st.integers(min_value=0, max_value=300_000), st.integers(min_value=-1_000_000, max_value=0)),
        abort=st.booleans(),
    ),
    min_size=1,
    max_size=3,
)
EVENTS = st.lists(
    st.tuples(
        st.one_of(st.integers(min_value=0, max_value=2_000), st.integers(min_value=0, max_value=400_000)),
        st.integers(min_value=0, max_value=2),
        st.sampled_from(["reserve", "settle", "tick"]),
    ),
    max_size=40,
)


@PROPERTY
@given(
    orders=ORDERS,
    events=EVENTS,
    available=st.integers(min_value=0, max_value=6),
    retention_ms=st.sampled_from([1, 1_000, 250_000]),
)
def test_whatever_is_redelivered_whenever_scoops_are_never_left_reserved_for_a_settled_order_nor_reserved_twice(
    orders: list[Order], events: list[tuple[int, int, str]], available: int, retention_ms: int
) -> None:
    """Orders of one flavour, each as the flavour's partition brings it: its first reservation (before its deadline and
    the retention, as the dispatch sends it), then its reservation again any number of times (replays), its release
    or delivery (the first one settles it) and those again, and ticks, at any times. No order holds scoops once
    settled, none has its scoops taken twice, the stock balances, a mark goes only once its retention has passed
    since its settle and its deadline, and only a reservation past its deadline and the retention is refused late."""
    kitchen = Kitchen(retention_ms, Stock("mint", available=available, initial=available))
    now = 0
    for gap, index, kind in events:
        now += gap
        name = f"o-{index % len(orders)}"
        order = orders[index % len(orders)]
        if kind == "tick":
            for gone in kitchen.tick(now):
                gone_order = orders[int(gone.removeprefix("o-"))]
                assert gone_order.settled_ms is not None
                assert gone_order.deadline_ms is not None
                assert now >= max(gone_order.settled_ms, gone_order.deadline_ms) + retention_ms, f"{gone}'s mark went early"
        elif order.first_reserved_ms is None:
            # the partition's order: an order's first reservation comes before its release or delivery, and (in normal
            # operation) before its deadline and the retention have passed: the deadline is set so from its slack
            order.first_reserved_ms = now
            order.deadline_ms = now + max(order.slack_ms, 1 - retention_ms)
            kitchen.reserve(name, order.scoops, order.deadline_ms, now)
            assert (name, now) not in kitchen.refused_late, "a first reservation in time is never refused"
        elif kind == "reserve":
            assert order.deadline_ms is not None
            refused = len(kitchen.refused_late)
            kitchen.reserve(name, order.scoops, order.deadline_ms, now)
            if len(kitchen.refused_late) > refused:
                assert past_done_retention(order.deadline_ms, now, retention_ms)
        else:
            assert order.deadline_ms is not None
            if order.settle_kind is None:  # the dispatch's one settle: delivered when reserved, unless it aborted
                order.settle_kind = "deliver" if name in kitchen.stock.reserved and not order.abort else "release"
                order.settled_ms = now
            kitchen.settle(name, order.settle_kind, order.deadline_ms, now)
        stock = kitchen.stock
        assert stock.available >= 0
        assert stock.available + sum(stock.reserved.values()) + stock.delivered == stock.initial, f"the stock does not balance: {stock}"
        assert max(kitchen.taken.values(), default=0) <= 1, f"scoops taken twice: {kitchen.taken}"
        for number, each in enumerate(orders):
            if each.settled_ms is not None:
                assert f"o-{number}" not in stock.reserved, f"o-{number} settled, its scoops still reserved: {stock}"
    for number, each in enumerate(orders):
        if f"o-{number}" in kitchen.marks:
            assert (kitchen.marks[f"o-{number}"] + retention_ms, f"o-{number}") in kitchen.filed, "a mark has its deadline filed"
        if each.settle_kind == "deliver":
            assert f"o-{number}" not in kitchen.stock.refused
