"""Ticks: a timer sends one to each partition of a topic this worker owns; the owning agent does the work."""

from __future__ import annotations

import logging
from typing import Any

import faust

from weir.app.codec import dumps
from weir.app.core import app, settings, signals

__all__ = ["tick_owned", "tick_every"]

log = logging.getLogger(__name__)


async def tick_owned(topic: faust.TopicT, value: Any = None) -> None:
    """Send ``value`` (default ``{"kind": "tick"}``) to each partition of ``topic`` this worker owns (handled in stream order).

    Tables can only change inside stream processing, so a timer never expires state itself.
    """
    name = topic.get_topic_name()
    encoded = dumps({"kind": "tick"} if value is None else value)
    try:
        for tp in app.consumer.assignment():
            if tp.topic == name:
                await signals.send(name, encoded, tp.partition)
    except Exception as error:  # not assigned yet, or mid-rebalance: the next tick tries again
        log.debug("tick of %s skipped: %s", name, error)


def tick_every(topic: faust.TopicT, interval_ms: int | None = None, value: Any = None) -> None:
    """Register a timer that ticks ``topic``'s owned partitions every ``interval_ms`` (default WEIR_TICK_INTERVAL_MS)."""

    async def tick() -> None:
        await tick_owned(topic, value)

    app.timer(interval=(interval_ms or settings.tick_interval_ms) / 1000)(tick)
