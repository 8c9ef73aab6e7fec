"""Aggregator: merges item outcomes by correlation id; completes by count, last-flag or timeout (``app.aggregation``)."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from app.aggregation import Aggregation
from app.core import app, handle_events, topics
from app.pipeline import AGGREGATOR
from app.runtime.keyed import Output
from app.ticks import tick_every
from tables.aggregator_tables import deadlines, done_groups, open_groups

__all__ = ["CONFIG", "aggregation"]

AGENT = "aggregator"
CONFIG = AGGREGATOR


def _result(event: EventT[bytes], correlation_id: str, result: dict[str, Any], context: Any) -> list[Output]:
    return [Output(topics.aggregates, correlation_id, result, what="the result")]


aggregation = Aggregation(
    agent=AGENT, config=CONFIG, open_groups=open_groups, done_groups=done_groups, deadlines=deadlines, outputs=_result
)


@app.agent(topics.item_results)
async def aggregator(stream: StreamT[bytes]) -> None:
    """Reads 'open', 'item', 'items' (a chunk's outcomes) and 'tick' messages keyed by correlation id, in batches.

    A batch's part of a partition is one scope (``app.core.run_parts``): a group that gets ten outcomes in
    it is read once and written once.
    """
    await handle_events(stream, agent=AGENT, what="aggregator: message", handler=aggregation.handle)


tick_every(topics.item_results)
