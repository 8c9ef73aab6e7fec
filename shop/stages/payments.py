"""The payment gateway: decides each card (Luhn fact, seeded draw), captures or rejects, then commits or voids; all logged.

The gateway sees a card's reference only (token, last four digits, the Luhn fact the screen established where the
number was); its draw is keyed by screen, line and order id (:func:`shop.state.gateway_decision`), so a capture
replayed after a crash decides the same. A capture, commit or void seen again while the ticket's payment is kept
changes nothing: a capture is answered what was decided (while the payment is captured or rejected), a settle
already made is absorbed.

A payment that is final (committed, voided, or rejected) is kept for the done retention (``WEIR_DONE_RETENTION_MS``,
as the kitchen keeps its settled marks) after it became final and after its order's deadline, whichever is later;
then a tick deletes its key (:func:`shop.state.payment_due`). A payment still captured never expires: its commit
or void is still to come. A message for a ticket whose payment expired:

- a capture captures nothing and answers nothing, as the order has its outcome (the kitchen's precedent for a
  reservation after its order settled): the capture carries its order's deadline, and one that finds no payment
  once that deadline and the retention have passed is dead-lettered ``late-capture``
  (:func:`shop.state.late_capture`). A payment's key outlives its capture's deadline by the retention, so the same
  capture delivered again after the key went is always that late, never charged twice. (A capture without a
  deadline, written before captures carried one, is decided again as a first capture.)
- a commit or a void finds no capture to settle: it is dead-lettered (``rejected``) and changes nothing.

A keyed logic: one state per order ticket, a deadline per final payment (index ``shop_payments_deadlines``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shop.state import Capture, Payment, late_capture, on_capture, on_payment_deadline, on_settle, payment_deadlines, payment_due
from weir.app.keyed_stage import KeyedLogic, Transition, keyed_stage
from weir.app.runtime.keyed import Change, Refusal
from weir.app.shell import InvalidMessage
from weir.app.stages import Stage

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["LATE_CAPTURE", "PAYMENTS_TABLE", "PAYMENTS_DEADLINES", "payments_stage"]

#: The reason of the dead letter of a capture that came after its order's deadline and the retention, and found no payment.
LATE_CAPTURE = "late-capture"
#: The payment gateway's table and its deadline index: names and help texts.
PAYMENTS_TABLE = (
    "shop_payments",
    "Payments by order ticket: the gateway's decision, captured then committed or voided, or rejected and why; the card "
    "as its token and last four digits. A committed, voided or rejected payment is kept for WEIR_DONE_RETENTION_MS "
    "(after its order's deadline too), then it goes (value: shop.state.Payment).",
)
PAYMENTS_DEADLINES = (
    "shop_payments_deadlines",
    "Deadline index of table shop_payments (app.deadlines.DeadlineIndex): final payments to drop after the done retention.",
)


def payments_stage(shop: ShopStages) -> Stage:
    """Reads captures, commits and voids, keyed by order ticket."""
    settings = shop.shop
    retention_ms = shop.settings.done_retention_ms

    def capture(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
        try:
            request = Capture.from_message(message)
        except ValueError as malformed:
            raise InvalidMessage(f"shop payments: capture of {order_id!r}: {malformed}") from None
        late = late_capture(previous, request, now, retention_ms)
        if late is not None:
            return Change(state=previous, rejected=(Refusal(LATE_CAPTURE, late),))
        captured, sends = on_capture(previous, request, settings.seed, settings.card_reject_rate, now)
        return Change(state=captured, outputs=shop.outputs(sends), deadlines=payment_deadlines(previous, captured, retention_ms))

    def settle(commit: bool) -> Transition[Payment]:
        def transition(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
            settled, sends, error = on_settle(previous, order_id, commit, now)
            # a settle that finds nothing to settle keeps what is there
            state = settled if settled is not None else previous
            deadlines = payment_deadlines(previous, state, retention_ms)
            return Change(state=state, outputs=shop.outputs(sends), rejected=(error,) if error else (), deadlines=deadlines)

        return transition

    def expired(key: str, payment: Payment, now: int) -> Change[Payment]:
        return Change(state=on_payment_deadline(payment, now, retention_ms))

    logic: KeyedLogic[Payment] = KeyedLogic(
        name="shop_payments",
        key_of=_order_id,
        on_message={"capture": capture, "commit": settle(True), "void": settle(False)},
        encode=Payment.to_dict,
        decode=Payment.from_dict,
        due_ms=lambda _kind, payment: payment_due(payment, retention_ms),
        on_deadline=expired,
        step="payment",
        deadline_kind="expiry",
        label="shop payments",
    )
    stage, _ = keyed_stage(logic, shop.wiring, source=shop.topics["payments"], table=PAYMENTS_TABLE, deadlines=PAYMENTS_DEADLINES)
    return stage


def _order_id(message: Any, _record_key: str) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str):
        raise InvalidMessage("shop payments: a message must be a JSON object with a string 'order_id'")
    order_id: str = message["order_id"]
    return order_id
