"""The payment gateway: decides each card (Luhn fact, seeded draw), captures or rejects, then commits or voids; all logged.

The gateway sees a card's reference only (token, last four digits, the Luhn fact the screen established where the
number was); its draw is keyed by screen, line and order id (:func:`shop.state.gateway_decision`), so a capture
replayed after a crash decides the same. A keyed logic: one state per order ticket, no deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shop.state import Capture, Payment, on_capture, on_settle
from weir.app.keyed_stage import KeyedLogic, Transition, keyed_stage
from weir.app.runtime.keyed import Change
from weir.app.shell import InvalidMessage
from weir.app.stages import Stage

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["PAYMENTS_TABLE", "payments_stage"]

#: The payment gateway's table: its name and help text.
PAYMENTS_TABLE = (
    "shop_payments",
    "Payments by order ticket: the gateway's decision, captured then committed or voided, or rejected and why; the card "
    "as its token and last four digits (value: shop.state.Payment).",
)


def payments_stage(shop: ShopStages) -> Stage:
    """Reads captures, commits and voids, keyed by order ticket."""
    settings = shop.shop

    def capture(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
        try:
            request = Capture.from_message(message)
        except ValueError as malformed:
            raise InvalidMessage(f"shop payments: capture of {order_id!r}: {malformed}") from None
        captured, sends = on_capture(previous, request, settings.seed, settings.card_reject_rate, now)
        return Change(state=captured, outputs=shop.outputs(sends))

    def settle(commit: bool) -> Transition[Payment]:
        def transition(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
            settled, sends, error = on_settle(previous, order_id, commit, now)
            # a settle that finds nothing to settle keeps what is there
            state = settled if settled is not None else previous
            return Change(state=state, outputs=shop.outputs(sends), rejected=(error,) if error else ())

        return transition

    logic: KeyedLogic[Payment] = KeyedLogic(
        name="shop_payments",
        key_of=_order_id,
        on_message={"capture": capture, "commit": settle(True), "void": settle(False)},
        encode=Payment.to_dict,
        decode=Payment.from_dict,
        step="payment",
        label="shop payments",
    )
    stage, _ = keyed_stage(logic, shop.wiring, source=shop.topics["payments"], table=PAYMENTS_TABLE)
    return stage


def _order_id(message: Any, _record_key: str) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str):
        raise InvalidMessage("shop payments: a message must be a JSON object with a string 'order_id'")
    order_id: str = message["order_id"]
    return order_id
