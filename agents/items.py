"""Per-item workers: run the item step (a user function) with retries; report each item's outcome (``app.aggregation``)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from faust.types import EventT, StreamT

from app.aggregation import ItemWorker, parse_items
from app.catalogue import CATALOGUE_CENTS
from app.core import app, handle_parts, retry_policy, settings, topics
from app.errors import StepOutcome, run_with_retry

__all__ = ["parse_items", "price_item", "load_processor", "CATALOGUE_CENTS"]

AGENT = "items"


def price_item(payload: Any) -> dict[str, Any]:
    """The demo's item step: price an ice-cream item from the catalogue."""
    flavour = payload.get("flavour") if isinstance(payload, dict) else None
    scoops = payload.get("scoops") if isinstance(payload, dict) else None
    if flavour not in CATALOGUE_CENTS:
        message = f"item step 'price': unknown flavour {flavour!r}, expected one of {sorted(CATALOGUE_CENTS)}"
        raise ValueError(message)
    if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
        message = f"item step 'price': 'scoops' must be a positive integer, got {scoops!r}"
        raise ValueError(message)
    return {"flavour": flavour, "scoops": scoops, "price_cents": CATALOGUE_CENTS[flavour] * scoops}


def load_processor(spec: str) -> Callable[[Any], Any]:
    """Import the item step named ``module:function``."""
    module_name, _, function_name = spec.partition(":")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        message = f"setting WEIR_ITEM_PROCESSOR={spec!r}: expected 'module:function' naming a callable"
        raise ValueError(message)
    return function  # type: ignore[no-any-return]


_process = load_processor(settings.item_processor)


async def _step(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
    return await run_with_retry(retry_policy, lambda: _process(payload))


worker = ItemWorker(
    agent=AGENT,
    step=_step,
    results=topics.item_results,
    concurrent=asyncio.iscoroutinefunction(_process),  # a sync step runs to the end anyway
    concurrency=settings.item_concurrency,
    bundle=settings.bundle,
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
