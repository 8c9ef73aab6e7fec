"""Shop payment gateway: capture (or reject the card), then commit on delivery or void on abort; every step logged."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import send_all, shop_topics
from app.core import InvalidMessage, app, handle_events, now_ms, send_dead_letter
from tables.shop import Payment, on_capture, on_settle
from tables.shop_payment_tables import payments

__all__ = ["shop_payments"]

AGENT = "shop_payments"


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str):
        raise InvalidMessage("shop payments: a message must be a JSON object with a string 'order_id'")
    order_id = message["order_id"]
    raw = payments.get(order_id)
    previous = None if raw is None else Payment.from_dict(raw)
    kind = message.get("kind")
    if kind == "capture":
        amount, accepted = message.get("amount_cents"), message.get("accepted")
        if not isinstance(amount, int) or not isinstance(accepted, bool):
            raise InvalidMessage(f"shop payments: capture of {order_id!r} needs an integer 'amount_cents' and a boolean 'accepted'")
        captured, sends = on_capture(previous, order_id, amount, accepted, now_ms())
        payment: Payment | None = captured
        error = None
    elif kind in ("commit", "void"):
        settled, sends, error = on_settle(previous, order_id, kind == "commit", now_ms())
        payment = settled
    else:
        raise InvalidMessage(f"shop payments: 'kind' must be 'capture', 'commit' or 'void', got {kind!r:.60}")
    if error is not None:
        await send_dead_letter(event, reason="rejected", error=error, agent=AGENT, step=str(kind))
    if payment is not None and payment != previous:
        payments[order_id] = payment.to_dict()
    await send_all(sends)


@app.agent(shop_topics["payments"])
async def shop_payments(stream: StreamT[bytes]) -> None:
    """Reads captures, commits and voids, keyed by order ticket."""
    await handle_events(stream, agent=AGENT, what="shop payments: message", handler=_handle)
