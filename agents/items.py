"""Per-item workers: run the item step (``app.pipeline``) with retries; report each item's outcome (``app.aggregation``)."""

from __future__ import annotations

from collections.abc import Sequence

from faust.types import EventT, StreamT

from app.aggregation import ItemWorker, parse_items
from app.core import app, handle_parts, settings, topics
from app.pipeline import STEP_IN_PLACE, STEP_RUNS_AT_ONCE, load_processor, step

__all__ = ["parse_items", "load_processor"]

AGENT = "items"


worker = ItemWorker(
    agent=AGENT,
    step=step,
    results=topics.item_results,
    concurrent=STEP_RUNS_AT_ONCE,
    concurrency=settings.item_concurrency,
    bundle=settings.bundle,
    in_place=STEP_IN_PLACE,
)


@app.agent(topics.items)
async def items(stream: StreamT[bytes]) -> None:
    """Runs the item step on every item of every item message (in batches); each message's outcomes go to the aggregator in one message.

    One actor, so that each partition is handled in order (``app.core.run_parts``). An async step runs on
    every item of a batch at once, up to ``WEIR_ITEM_CONCURRENCY`` items at a time per worker. The outcome
    messages of a batch's part go out in bundles, one record per aggregator partition (``WEIR_BUNDLE``).
    """

    async def handle_part(part: Sequence[EventT[bytes]]) -> None:
        await worker.handle_part(part, what="items: item")

    await handle_parts(stream, handle_part, concurrent=worker.concurrent)
