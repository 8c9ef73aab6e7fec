"""Shop kitchen: each flavour's container is one key of the stock table, owned by one worker at a time."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import send_all, shop_topics
from app.core import InvalidMessage, app, handle_events, settings
from tables.shop import Send, Stock, on_deliver, on_release, on_reserve
from tables.shop_stock_tables import stock

__all__ = ["shop_kitchen"]

AGENT = "shop_kitchen"


def _container(flavour: str) -> Stock:
    raw = stock.get(flavour)
    if raw is None:  # the shop opens with a full container of every flavour
        opening = settings.opening_stock(flavour)
        return Stock(flavour=flavour, available=opening, initial=opening)
    return Stock.from_dict(raw)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str) or not isinstance(message.get("flavour"), str):
        raise InvalidMessage("shop kitchen: a message must be a JSON object with string 'order_id' and 'flavour'")
    order_id, flavour = message["order_id"], message["flavour"]
    container = _container(flavour)
    kind = message.get("kind")
    sends: list[Send] = []
    if kind == "reserve":
        scoops = message.get("scoops")
        if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
            raise InvalidMessage(f"shop kitchen: reservation of {order_id!r} needs a positive integer 'scoops'")
        updated, sends = on_reserve(container, order_id, scoops)
    elif kind == "release":
        updated = on_release(container, order_id)
    elif kind == "deliver":
        updated = on_deliver(container, order_id)
    else:
        raise InvalidMessage(f"shop kitchen: 'kind' must be 'reserve', 'release' or 'deliver', got {kind!r:.60}")
    if updated != container or stock.get(flavour) is None:
        stock[flavour] = updated.to_dict()
    await send_all(sends)


@app.agent(shop_topics["kitchen"])
async def shop_kitchen(stream: StreamT[bytes]) -> None:
    """Reads reservations, releases and deliveries, keyed by flavour."""
    await handle_events(stream, agent=AGENT, what="shop kitchen: message", handler=_handle)
