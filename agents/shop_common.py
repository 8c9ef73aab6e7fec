"""What the shop's agents share: their topics and how a core's messages are sent."""

from __future__ import annotations

import faust

from app.codec import dumps
from app.core import app, settings, topics
from tables.shop import Send

__all__ = ["shop_topics", "send_all", "SHOP_TOPICS"]

#: Every topic of the shop and its key: orders/payments/dispatch/outcomes/transactions by ticket,
#: kitchen by flavour, screens/reports by screen.
SHOP_TOPICS = ("orders", "payments", "kitchen", "dispatch", "outcomes", "screens", "reports", "transactions")


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(f"shop.{name}"), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


shop_topics: dict[str, faust.TopicT] = {name: _topic(name) for name in SHOP_TOPICS}
topics.extra.extend(shop_topics.values())


async def send_all(sends: list[Send]) -> None:
    """Send the core's messages; awaited, so under exactly_once they join the event's transaction."""
    pending = [await shop_topics[send.to].send(key=send.key.encode(), value=dumps(send.value)) for send in sends]
    for future in pending:
        await future
