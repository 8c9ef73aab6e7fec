"""What the shop's agents share: their settings, their topics and how a core's messages are sent."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import faust
from faust.types import EventT

from shop.settings import ShopSettings
from shop.stages import ShopStages
from shop.state import Send
from weir.app.runtime.keyed import Output, Undeliverable, send_checked
from weir.app.serve import worker_wiring

__all__ = ["shop_settings", "shop_stages", "shop_topics", "send_all", "outputs"]

#: The shop's settings, read once when a worker imports its agents (weir's are ``weir.app.core.settings``).
shop_settings = ShopSettings.from_env()


@functools.cache
def shop_stages() -> ShopStages:
    """The shop's stages and topics on this worker's wiring (one Faust topic per name, created at start)."""
    return ShopStages(worker_wiring(), shop_settings)


shop_topics: dict[str, faust.TopicT] = shop_stages().topics


def outputs(sends: Sequence[Send]) -> tuple[Output, ...]:
    """The core's messages as the runtime's outputs."""
    return shop_stages().outputs(sends)


async def send_all(event: EventT[bytes], sends: Sequence[Send], *, agent: str) -> list[Undeliverable]:
    """Send the core's messages, checked (:func:`weir.app.runtime.keyed.send_checked`): under exactly_once they join the
    event's transaction; one that cannot be written is dead-lettered, never a crash. Returns those."""
    return await send_checked(event, outputs(sends), agent=agent, step="send")
