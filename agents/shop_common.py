"""What the shop's agents share: their topics and how a core's messages are sent."""

from __future__ import annotations

from collections.abc import Sequence

import faust
from faust.types import EventT

from app.core import app, settings, topics
from app.runtime.keyed import Output, Undeliverable, send_checked
from tables.shop import SHOP_TOPICS, Send

__all__ = ["shop_topics", "send_all", "outputs"]


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(f"shop.{name}"), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


shop_topics: dict[str, faust.TopicT] = {name: _topic(name) for name in SHOP_TOPICS}
topics.extra.extend(shop_topics.values())


def outputs(sends: Sequence[Send]) -> tuple[Output, ...]:
    """The core's messages as the runtime's outputs."""
    return tuple(Output(shop_topics[send.to], send.key, send.value, what=f"shop.{send.to}") for send in sends)


async def send_all(event: EventT[bytes], sends: Sequence[Send], *, agent: str) -> list[Undeliverable]:
    """Send the core's messages, checked (:func:`app.runtime.keyed.send_checked`): under exactly_once they join the
    event's transaction; one that cannot be written is dead-lettered, never a crash. Returns those."""
    return await send_checked(event, outputs(sends), agent=agent, step="send")
