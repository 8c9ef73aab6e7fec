"""The shop's stages built on weir's keyed-stage primitive (:func:`weir.app.keyed_stage.keyed_stage`).

A stage here is a value built from a wiring and the shop's settings: a worker serves it
(``shop/agents/<stage>.py``: ``serve(...)`` on the worker's wiring), weir's test driver runs it in process
(``TestDriver(topologies=[lambda wiring: ShopStages(wiring, settings)])``). The payment gateway is one so far; the
orders, claims and kitchen stages are still Faust agents of their own (``shop/agents``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shop.settings import ShopSettings
from shop.state import DAY_AGGREGATE, DAY_COUNTER, SHOP_TOPICS, Capture, Payment, Send, on_capture, on_settle
from weir.app.keyed_stage import KeyedLogic, Transition, keyed_stage
from weir.app.runtime.keyed import Change, Output
from weir.app.shell import InvalidMessage
from weir.app.stages import Stage, Wiring
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_COUNTER

__all__ = ["PAYMENTS_TABLE", "ShopStages"]

#: The payment gateway's table: its name and help text.
PAYMENTS_TABLE = (
    "shop_payments",
    "Payments by order ticket: the gateway's decision, captured then committed or voided, or rejected and why; the card "
    "as its token and last four digits (value: shop.state.Payment).",
)


class ShopStages:
    """The shop's topics (``shop.<name>`` and the end of day's aggregate and counter) and its keyed stages."""

    def __init__(self, wiring: Wiring, shop: ShopSettings) -> None:
        self.wiring = wiring
        self.shop = shop
        self.topics: dict[str, Any] = {name: wiring.topic_named(f"shop.{name}") for name in SHOP_TOPICS}
        #: every topic a core's message may go to: the shop's, and the end of day's (the end-of-stream job's)
        self.targets: dict[str, Any] = {
            **self.topics,
            DAY_AGGREGATE: wiring.topic_named(TOPIC_AGGREGATE),
            DAY_COUNTER: wiring.topic_named(TOPIC_COUNTER),
        }

    def outputs(self, sends: Sequence[Send]) -> tuple[Output, ...]:
        """The core's messages as the runtime's outputs."""
        return tuple(
            Output(
                self.targets[send.to], send.key, send.value, what=send.to if send.to in (DAY_AGGREGATE, DAY_COUNTER) else f"shop.{send.to}"
            )
            for send in sends
        )

    def stages(self) -> list[Stage]:
        return [self.payments_stage()]

    # -- the payment gateway: decides each card (Luhn fact, seeded draw), captures or rejects, then commits or voids

    def payments_stage(self) -> Stage:
        """Reads captures, commits and voids, keyed by order ticket (the gateway sees a card's reference only; its draw
        is keyed by screen, line and order id, so a capture replayed after a crash decides the same)."""
        shop = self.shop

        def capture(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
            try:
                request = Capture.from_message(message)
            except ValueError as malformed:
                raise InvalidMessage(f"shop payments: capture of {order_id!r}: {malformed}") from None
            captured, sends = on_capture(previous, request, shop.seed, shop.card_reject_rate, now)
            return Change(state=captured, outputs=self.outputs(sends))

        def settle(commit: bool) -> Transition[Payment]:
            def transition(previous: Payment | None, order_id: str, message: dict[str, Any], now: int) -> Change[Payment]:
                settled, sends, error = on_settle(previous, order_id, commit, now)
                # a settle that finds nothing to settle keeps what is there
                state = settled if settled is not None else previous
                return Change(state=state, outputs=self.outputs(sends), rejected=(error,) if error else ())

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
        stage, _ = keyed_stage(logic, self.wiring, source=self.topics["payments"], table=PAYMENTS_TABLE)
        return stage


def _order_id(message: Any) -> str:
    if not isinstance(message, dict) or not isinstance(message.get("order_id"), str):
        raise InvalidMessage("shop payments: a message must be a JSON object with a string 'order_id'")
    order_id: str = message["order_id"]
    return order_id
