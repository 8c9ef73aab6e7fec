"""Shop kitchen: each flavour's container is one key of the stock table, owned by one worker at a time.

The kitchen also remembers, for the done retention, each order it delivered or released per flavour
(table ``shop_kitchen_settled``): a reservation that comes after it (the orders stage sent it again, or
it lost the race with a timeout's release) reserves nothing. Ticks drop those marks when they expire.

Not a keyed logic: an event changes the flavour's container and may file the order's mark, a key of another
table (with a deadline index of its own), in the same scope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from faust.types import EventT

from shop.state import Send, Stock, on_deliver, on_release, on_reserve
from weir.app.deadlines import DeadlineIndex, deadline_bucket
from weir.app.runtime.keyed import Change, KeyedState, TableStore
from weir.app.shell import InvalidMessage, now_ms
from weir.app.stages import Stage, per_event

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["AGENT", "STOCK_TABLE", "kitchen_stage"]

AGENT = "shop_kitchen"
STOCK_TABLE = (
    "shop_stock",
    "Stock per flavour, one container per key, owned by one kitchen worker at a time: scoops available, "
    "reserved per order, delivered (value: shop.state.Stock).",
)
SETTLED_TABLE = (
    "shop_kitchen_settled",
    "Orders the kitchen delivered or released, per flavour (key 'flavour/ticket', value: when), kept for "
    "the done retention: a reservation that comes again after that reserves nothing.",
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
            due = settled_ms + retention_ms
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
        current = container(flavour)
        mark = f"{flavour}/{order_id}"
        kind = message.get("kind")
        sends: list[Send] = []
        if kind == "reserve":
            scoops = message.get("scoops")
            if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
                raise InvalidMessage(f"shop kitchen: reservation of {order_id!r} needs a positive integer 'scoops'")
            updated, sends = on_reserve(current, order_id, scoops, settled=settled.get(mark) is not None)
        elif kind in ("release", "deliver"):
            updated = on_release(current, order_id) if kind == "release" else on_deliver(current, order_id)
            if settled.get(mark) is None:
                now = now_ms()
                settled[mark] = now
                settled_index.add(event.message.partition, "settled", mark, now + retention_ms)
        else:
            raise InvalidMessage(f"shop kitchen: 'kind' must be 'reserve', 'release' or 'deliver', got {kind!r:.60}")
        # A container first met is written even unchanged: the table then shows every flavour's stock.
        previous = containers.load(flavour)
        await containers.apply(event, flavour, previous, Change(state=updated, outputs=shop.outputs(sends)))

    handler = per_event(agent=AGENT, what="shop kitchen: message", handler=handle)
    return Stage(AGENT, (shop.topics["kitchen"],), handler, ticked=(shop.topics["kitchen"],))
