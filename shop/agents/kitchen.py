"""Shop kitchen: each flavour's container is one key of the stock table, owned by one worker at a time.

The kitchen also remembers, for the done retention, each order it delivered or released per flavour
(table ``shop_kitchen_settled``): a reservation that comes after it (the orders stage sent it again, or
it lost the race with a timeout's release) reserves nothing. Ticks drop those marks when they expire.
"""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from shop.agents.common import outputs, shop_settings, shop_topics
from shop.state import Send, Stock, on_deliver, on_release, on_reserve
from shop.tables.stock import settled, settled_deadlines, stock
from weir.app.core import InvalidMessage, app, handle_events, now_ms, settings
from weir.app.deadlines import DeadlineIndex, deadline_bucket
from weir.app.runtime.keyed import Change, KeyedState, TableStore
from weir.app.ticks import tick_every

__all__ = ["shop_kitchen"]

AGENT = "shop_kitchen"
settled_index = DeadlineIndex(settled_deadlines)
containers: KeyedState[Stock] = KeyedState(agent=AGENT, store=TableStore(stock, Stock.to_dict, Stock.from_dict), step="stock")


def _container(flavour: str) -> Stock:
    raw = stock.get(flavour)
    if raw is None:  # the shop opens with a full container of every flavour
        opening = shop_settings.opening_stock(flavour)
        return Stock(flavour=flavour, available=opening, initial=opening)
    return Stock.from_dict(raw)


async def _on_tick(event: EventT[bytes], now: int) -> None:
    async def expire(_: str, key: str) -> bool:
        settled_ms = settled.get(key)
        if settled_ms is None:
            return False
        due = settled_ms + settings.done_retention_ms
        if due > now:
            return deadline_bucket(due) <= deadline_bucket(now)  # later in this second: the next tick
        del settled[key]
        return False

    await settled_index.walk(event.message.partition, now, expire)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if isinstance(message, dict) and message.get("kind") == "tick":
        await _on_tick(event, now_ms())
        return
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str) or not isinstance(message.get("flavour"), str):
        raise InvalidMessage("shop kitchen: a message must be a JSON object with string 'order_id' and 'flavour'")
    order_id, flavour = message["order_id"], message["flavour"]
    container = _container(flavour)
    mark = f"{flavour}/{order_id}"
    kind = message.get("kind")
    sends: list[Send] = []
    if kind == "reserve":
        scoops = message.get("scoops")
        if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
            raise InvalidMessage(f"shop kitchen: reservation of {order_id!r} needs a positive integer 'scoops'")
        updated, sends = on_reserve(container, order_id, scoops, settled=settled.get(mark) is not None)
    elif kind in ("release", "deliver"):
        updated = on_release(container, order_id) if kind == "release" else on_deliver(container, order_id)
        if settled.get(mark) is None:
            now = now_ms()
            settled[mark] = now
            settled_index.add(event.message.partition, "settled", mark, now + settings.done_retention_ms)
    else:
        raise InvalidMessage(f"shop kitchen: 'kind' must be 'reserve', 'release' or 'deliver', got {kind!r:.60}")
    # A container first met is written even unchanged: the table then shows every flavour's stock.
    previous = containers.load(flavour)
    await containers.apply(event, flavour, previous, Change(state=updated, outputs=outputs(sends)))


@app.agent(shop_topics["kitchen"])
async def shop_kitchen(stream: StreamT[bytes]) -> None:
    """Reads reservations, releases and deliveries keyed by flavour, and ticks."""
    await handle_events(stream, agent=AGENT, what="shop kitchen: message", handler=_handle)


tick_every(shop_topics["kitchen"])
