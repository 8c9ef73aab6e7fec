"""What the end-of-stream agents share: their topics, the protocol's settings, ticks and sends."""

from __future__ import annotations

import faust

from app.catalogue import CATALOGUE_CENTS
from app.codec import dumps
from app.core import app, settings, topics
from tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_REPORTS, Emit, EofConfig, OpeningHours

__all__ = ["batches_topic", "counter_topic", "aggregate_topic", "reports_topic", "CONFIG", "HOURS", "CATALOGUE", "emit"]


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(name), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


batches_topic = _topic(TOPIC_BATCHES)
counter_topic = _topic(TOPIC_COUNTER)
aggregate_topic = _topic(TOPIC_AGGREGATE)
reports_topic = _topic(TOPIC_REPORTS)
topics.extra.extend([batches_topic, counter_topic, aggregate_topic, reports_topic])

CONFIG = EofConfig(idle_timeout_ms=settings.eof_idle_timeout_ms, closed_retention_ms=settings.eof_closed_retention_ms)
HOURS = OpeningHours()
#: The flavour catalogue (price per scoop in cents) the filter checks and the report joins with.
CATALOGUE = CATALOGUE_CENTS


async def emit(client: str, emits: list[Emit]) -> None:
    """Send the core's messages, keyed by the client; awaited, so they join the event's transaction."""
    targets = {"aggregate": aggregate_topic, "reports": reports_topic}
    sent = [await targets[message.to].send(key=client.encode(), value=dumps(message.value)) for message in emits]
    for future in sent:
        await future
