"""Shop orders: a screen's line becomes a capture, one reservation per flavour and an open at the dispatch barrier."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import send_all, shop_topics
from app.catalogue import CATALOGUE_CENTS
from app.core import InvalidMessage, app, handle_events, now_ms, send_dead_letter, settings
from tables.shop import INVALID, Send, card_accepted, parse_shop_order

__all__ = ["shop_orders"]

AGENT = "shop_orders"


def parse_envelope(message: Any) -> tuple[str, str, int, str]:
    """(ticket, screen, line number, text) of a screen's message."""
    if not isinstance(message, dict):
        raise InvalidMessage(f"shop orders: a screen message must be a JSON object, got {type(message).__name__}")
    ticket, screen, line, text = message.get("ticket"), message.get("screen"), message.get("line"), message.get("text")
    if not isinstance(ticket, str) or not isinstance(screen, str) or not isinstance(line, int) or not isinstance(text, str):
        raise InvalidMessage("shop orders: a screen message needs 'ticket' (str), 'screen' (str), 'line' (int) and 'text' (str)")
    return ticket, screen, line, text


async def _take_order(event: EventT[bytes], message: Any) -> None:
    ticket, screen, line, text = parse_envelope(message)
    order, problem = parse_shop_order(text, CATALOGUE_CENTS)
    if order is None:
        # The line is dead-lettered with its reason, and still gets its one outcome (counted as invalid).
        await send_dead_letter(event, reason="invalid", error=f"screen {screen} line {line}: {problem}", agent=AGENT, step="parse")
        outcome = {
            "ticket": ticket,
            "screen": screen,
            "line": line,
            "order_id": None,
            "status": INVALID,
            "reason": problem,
            "amount_cents": 0,
        }
        await send_all([Send("outcomes", ticket, outcome), Send("screens", screen, {"kind": "outcome", **outcome})])
        return
    # The card's fate depends on the seed, the screen's name (not its day), the line and the order: same files, same fates.
    screen_name = screen.rsplit("/", 1)[-1]
    accepted = card_accepted(settings.shop_seed, f"{screen_name}/{line}/{order.order_id}", settings.shop_card_reject_rate)
    opened = {
        "kind": "open",
        "order_id": ticket,
        "ticket": ticket,
        "screen": screen,
        "line": line,
        "order": {"order_id": order.order_id, "card": order.card, "scoops": order.scoops, "amount_cents": order.amount_cents},
        "deadline_ms": now_ms() + settings.shop_dispatch_timeout_ms,
    }
    capture = {"kind": "capture", "order_id": ticket, "amount_cents": order.amount_cents, "accepted": accepted}
    sends = [Send("dispatch", ticket, opened), Send("payments", ticket, capture)]
    sends += [
        Send("kitchen", flavour, {"kind": "reserve", "order_id": ticket, "flavour": flavour, "scoops": scoops})
        for flavour, scoops in sorted(order.scoops.items())
    ]
    await send_all(sends)


@app.agent(shop_topics["orders"])
async def shop_orders(stream: StreamT[bytes]) -> None:
    """Reads the screens' lines (keyed by ticket)."""
    await handle_events(stream, agent=AGENT, what="shop orders: screen message", handler=_take_order)
