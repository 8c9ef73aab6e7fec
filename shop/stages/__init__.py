"""The shop's four stages as weir stages: values built from a wiring and the shop's settings.

A worker serves each (``shop/agents/<stage>.py``: ``serve(...)`` on the worker's wiring); weir's test driver runs
them in process (``TestDriver(topologies=[lambda wiring: ShopStages(wiring, settings)])``), on the same code.

- :mod:`shop.stages.orders`: a screen's line read as an order, sent to claim its id (no state);
- :mod:`shop.stages.claims`: each order id claimed once per screen's day (keyed by [screen, shard], tombstones);
- :mod:`shop.stages.payments`: the payment gateway, a keyed logic (:func:`weir.app.keyed_stage.keyed_stage`);
- :mod:`shop.stages.kitchen`: each flavour's container, and the orders it settled (kept for the done retention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shop.settings import ShopSettings
from shop.state import DAY_AGGREGATE, DAY_COUNTER, SHOP_TOPICS, Send
from weir.app.runtime.keyed import Output, Undeliverable, send_checked
from weir.app.stages import Stage, Wiring
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_COUNTER

__all__ = ["ShopStages"]


class ShopStages:
    """The shop's topics (``shop.<name>`` and the end of day's aggregate and counter) and its stages."""

    def __init__(self, wiring: Wiring, shop: ShopSettings) -> None:
        self.wiring = wiring
        self.settings = wiring.settings
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
        day = (DAY_AGGREGATE, DAY_COUNTER)
        return tuple(
            Output(self.targets[send.to], send.key, send.value, what=send.to if send.to in day else f"shop.{send.to}") for send in sends
        )

    async def send_all(self, event: Any, sends: Sequence[Send], *, agent: str) -> list[Undeliverable]:
        """Send the core's messages, checked (:func:`weir.app.runtime.keyed.send_checked`): under exactly_once they join
        the event's transaction; one that cannot be written is dead-lettered, never a crash. Returns those."""
        return await send_checked(event, self.outputs(sends), agent=agent, step="send")

    def orders_stage(self) -> Stage:
        from shop.stages.orders import orders_stage

        return orders_stage(self)

    def claims_stage(self) -> Stage:
        from shop.stages.claims import claims_stage

        return claims_stage(self)

    def payments_stage(self) -> Stage:
        from shop.stages.payments import payments_stage

        return payments_stage(self)

    def kitchen_stage(self) -> Stage:
        from shop.stages.kitchen import kitchen_stage

        return kitchen_stage(self)

    def stages(self) -> list[Stage]:
        return [self.orders_stage(), self.claims_stage(), self.payments_stage(), self.kitchen_stage()]
