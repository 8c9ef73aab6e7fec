"""What the shop's agents share: their settings, their topics and how a core's messages are sent."""

from __future__ import annotations

from collections.abc import Sequence

import faust
from faust.types import EventT

from shop.settings import ShopSettings
from shop.state import DAY_AGGREGATE, DAY_COUNTER, SHOP_TOPICS, Send
from weir.app.core import app, settings, topics
from weir.app.runtime.keyed import Output, Undeliverable, send_checked
from weir.app.serve import faust_topic
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_COUNTER

__all__ = ["shop_settings", "shop_topics", "send_all", "outputs"]

#: The shop's settings, read once when a worker imports its agents (weir's are ``app.core.settings``).
shop_settings = ShopSettings.from_env()


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(f"shop.{name}"), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


shop_topics: dict[str, faust.TopicT] = {name: _topic(name) for name in SHOP_TOPICS}
topics.extra.extend(shop_topics.values())
#: Every topic a core's message may go to: the shop's, and the end of day's (the end-of-stream pattern's).
#: The end of day's topics: the unnamed end-of-stream job's aggregate and counter (created at start here too).
_day_topics = {DAY_AGGREGATE: faust_topic(settings.topic(TOPIC_AGGREGATE)), DAY_COUNTER: faust_topic(settings.topic(TOPIC_COUNTER))}
topics.extra.extend(_day_topics.values())
_TARGETS: dict[str, faust.TopicT] = {**shop_topics, **_day_topics}


def outputs(sends: Sequence[Send]) -> tuple[Output, ...]:
    """The core's messages as the runtime's outputs."""
    return tuple(
        Output(_TARGETS[send.to], send.key, send.value, what=send.to if send.to in (DAY_AGGREGATE, DAY_COUNTER) else f"shop.{send.to}")
        for send in sends
    )


async def send_all(event: EventT[bytes], sends: Sequence[Send], *, agent: str) -> list[Undeliverable]:
    """Send the core's messages, checked (:func:`app.runtime.keyed.send_checked`): under exactly_once they join the
    event's transaction; one that cannot be written is dead-lettered, never a crash. Returns those."""
    return await send_checked(event, outputs(sends), agent=agent, step="send")
