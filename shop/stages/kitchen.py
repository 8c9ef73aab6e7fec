"""Shop kitchen: each flavour's container is one key of the stock table, owned by one worker at a time.

The kitchen also remembers, for the done retention, each order it delivered or released per flavour
(table ``shop_kitchen_settled``): a reservation that comes after it (the dispatch sent it again, or
it lost the race with a timeout's release) reserves nothing. Ticks drop those marks when they expire.

A reservation that comes after its order's mark expired must not reserve either: nothing would ever release or
deliver its scoops. Every message to the kitchen carries its order's deadline (``deadline_ms``, the open's), and:

- a mark is kept ``WEIR_DONE_RETENTION_MS`` after its first release or delivery and after its order's deadline,
  whichever is later (:func:`shop.state.kitchen_mark`, the value the mark holds);
- a reservation that finds no mark and nothing of its order in the container (no scoops reserved, no refusal)
  once its order's deadline and the retention have passed reserves nothing, answers nothing, and is
  dead-lettered ``late-reservation`` (:func:`shop.state.late_reservation`, the payments' rule for a late capture).

Why it closes the hole and refuses no reservation the dispatch still waits for. A mark filed at ``s`` for an order
whose deadline is ``d`` stays until ``max(s, d) + retention`` at least; every release or delivery files one, and
they alone take an order out of the container. So a reservation that finds neither mark nor order is the first of
that order and flavour, or comes after the mark went, at ``max(s, d) + retention >= d + retention`` or later:
exactly what the rule refuses. A first reservation is sent by the dispatch once the payment's wait ended with a
capture; that wait began when the open reached its barrier, after the claim that set ``d`` (claim time plus
``WEIR_SHOP_DISPATCH_TIMEOUT_MS``), and lasts the dispatch timeout at most (and a tick). So a first reservation may
come after ``d`` (its payment answered late in its wait), by no more than the time the open took from the claim to
its barrier plus the time the reservation took from the dispatch to the kitchen: it is refused only when those add
up to the retention (ten minutes by default; the retention is this margin, keep it well above a stage's stalls), a
stage stalled that long. The dispatch then stopped waiting long before (the kitchen's wait is the dispatch
timeout), and the order is aborted, voided and released: nothing is held. A reservation without a deadline
(written before reservations carried one) is taken as before, and a release or delivery without one files a mark
kept the retention after it.

Not a keyed logic: an event changes the flavour's container and may file the order's mark, a key of another
table (with a deadline index of its own), in the same scope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faust.types import EventT

from shop.state import Send, Stock, kitchen_mark, late_reservation, on_deliver, on_release, on_reserve, read_deadline
from weir.app.deadlines import DeadlineIndex, deadline_bucket
from weir.app.runtime.keyed import Change, KeyedState, Refusal, TableStore
from weir.app.shell import InvalidMessage, now_ms
from weir.app.stages import Stage, per_event

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["AGENT", "LATE_RESERVATION", "STOCK_TABLE", "kitchen_stage"]

AGENT = "shop_kitchen"
#: The reason of the dead letter of a reservation that came after its order's deadline and the retention, and found
#: neither the order's settled mark nor its reservation.
LATE_RESERVATION = "late-reservation"
STOCK_TABLE = (
    "shop_stock",
    "Stock per flavour, one container per key, owned by one kitchen worker at a time: scoops available, "
    "reserved per order, delivered (value: shop.state.Stock).",
)
SETTLED_TABLE = (
    "shop_kitchen_settled",
    "Orders the kitchen delivered or released, per flavour (key 'flavour/ticket', value: when it did, or the order's "
    "deadline if later), kept for the done retention after that: a reservation that comes again reserves nothing.",
)
SETTLED_DEADLINES = ("shop_kitchen_settled_deadlines", "Deadline index of table shop_kitchen_settled (app.deadlines.DeadlineIndex).")


def kitchen_stage(shop: ShopStages) -> Stage:
    """Reads reservations, releases and deliveries keyed by flavour, and ticks."""
    retention_ms = shop.settings.done_retention_ms
    stock = shop.wiring.table(*STOCK_TABLE)
    settled = shop.wiring.table(*SETTLED_TABLE)
    settled_index = DeadlineIndex(shop.wiring.table(*SETTLED_DEADLINES))
    containers: KeyedState[Stock] = KeyedState(agent=AGENT, store=TableStore(stock, Stock.to_dict, Stock.from_dict), step="stock")

    def container(flavour: str) -> Stock:
        raw = stock.get(flavour)
        if raw is None:  # the shop opens with a full container of every flavour
            opening = shop.shop.opening_stock(flavour)
            return Stock(flavour=flavour, available=opening, initial=opening)
        return Stock.from_dict(raw)

    async def on_tick(event: EventT[bytes], now: int) -> None:
        async def expire(_: str, key: str) -> bool:
            settled_ms = settled.get(key)
            if settled_ms is None:
                return False
            due = settled_ms + retention_ms  # the mark's value is already max(settled, order's deadline)
            if due > now:
                return deadline_bucket(due) <= deadline_bucket(now)  # later in this second: the next tick
            del settled[key]
            return False

        await settled_index.walk(event.message.partition, now, expire)

    async def handle(event: EventT[bytes], message: Any) -> None:
        if isinstance(message, dict) and message.get("kind") == "tick":
            await on_tick(event, now_ms())
            return
        if not isinstance(message, dict) or not isinstance(message.get("order_id"), str) or not isinstance(message.get("flavour"), str):
            raise InvalidMessage("shop kitchen: a message must be a JSON object with string 'order_id' and 'flavour'")
        order_id, flavour = message["order_id"], message["flavour"]
        kind = message.get("kind")
        try:
            deadline = read_deadline(message, f"shop kitchen: {kind!s:.20} of {order_id!r}: a message")
        except ValueError as malformed:
            raise InvalidMessage(str(malformed)) from None
        current = container(flavour)
        mark = f"{flavour}/{order_id}"
        sends: list[Send] = []
        rejected: tuple[Refusal, ...] = ()
        if kind == "reserve":
            scoops = message.get("scoops")
            if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
                raise InvalidMessage(f"shop kitchen: reservation of {order_id!r} needs a positive integer 'scoops'")
            is_settled = settled.get(mark) is not None
            late = late_reservation(current, order_id, deadline, now_ms(), retention_ms, settled=is_settled)
            if late is not None:
                updated, rejected = current, (Refusal(LATE_RESERVATION, late),)
            else:
                updated, sends = on_reserve(current, order_id, scoops, settled=is_settled)
        elif kind in ("release", "deliver"):
            updated = on_release(current, order_id) if kind == "release" else on_deliver(current, order_id)
            if settled.get(mark) is None:
                since = kitchen_mark(now_ms(), deadline)
                settled[mark] = since
                settled_index.add(event.message.partition, "settled", mark, since + retention_ms)
        else:
            raise InvalidMessage(f"shop kitchen: 'kind' must be 'reserve', 'release' or 'deliver', got {kind!r:.60}")
        # A container first met is written even unchanged: the table then shows every flavour's stock.
        previous = containers.load(flavour)
        await containers.apply(event, flavour, previous, Change(state=updated, outputs=shop.outputs(sends), rejected=rejected))

    handler = per_event(agent=AGENT, what="shop kitchen: message", handler=handle)
    return Stage(AGENT, (shop.topics["kitchen"],), handler, ticked=(shop.topics["kitchen"],))
