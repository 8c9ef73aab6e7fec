"""Shop payment gateway: decides each card (Luhn fact, seeded draw), captures or rejects, then commits or voids; all logged.

The gateway sees a card's reference only (token, last four digits, the Luhn fact the screen established where the
number was); its draw is keyed by screen, line and order id (shop.state.gateway_decision), so a capture replayed
after a crash decides the same.
"""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from shop.agents.common import outputs, shop_settings, shop_topics
from shop.state import Capture, Payment, on_capture, on_settle
from shop.tables.payments import payments
from weir.app.core import InvalidMessage, app, handle_events, now_ms
from weir.app.runtime.keyed import Change, KeyedState, TableStore

__all__ = ["shop_payments"]

AGENT = "shop_payments"
gateway: KeyedState[Payment] = KeyedState(agent=AGENT, store=TableStore(payments, Payment.to_dict, Payment.from_dict), step="payment")


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str):
        raise InvalidMessage("shop payments: a message must be a JSON object with a string 'order_id'")
    order_id = message["order_id"]
    previous = gateway.load(order_id)
    kind = message.get("kind")
    if kind == "capture":
        try:
            capture = Capture.from_message(message)
        except ValueError as malformed:
            raise InvalidMessage(f"shop payments: capture of {order_id!r}: {malformed}") from None
        captured, sends = on_capture(previous, capture, shop_settings.seed, shop_settings.card_reject_rate, now_ms())
        payment: Payment | None = captured
        error = None
    elif kind in ("commit", "void"):
        settled, sends, error = on_settle(previous, order_id, kind == "commit", now_ms())
        payment = settled
    else:
        raise InvalidMessage(f"shop payments: 'kind' must be 'capture', 'commit' or 'void', got {kind!r:.60}")
    # A settle that finds nothing to settle keeps what is there (None: no change).
    change = Change(state=payment if payment is not None else previous, outputs=outputs(sends), rejected=(error,) if error else ())
    await gateway.apply(event, order_id, previous, change)


@app.agent(shop_topics["payments"])
async def shop_payments(stream: StreamT[bytes]) -> None:
    """Reads captures, commits and voids, keyed by order ticket."""
    await handle_events(stream, agent=AGENT, what="shop payments: message", handler=_handle)
