"""Per-item workers: run the item step (a user function) with retries; report each item's outcome."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable
from typing import Any

from faust.types import EventT, StreamT

from app.catalogue import CATALOGUE_CENTS
from app.codec import dumps
from app.core import InvalidMessage, app, handle_events, retry_policy, send_dead_letter, settings, topics
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


def parse_items(raw: Any) -> list[tuple[str, int, int | None, bool, Any]]:
    """The items of an item message: one item (``index``, ``payload``) or a chunk (``items``: a list of them)."""
    if not isinstance(raw, dict):
        message = f"items: an item message must be a JSON object, got {type(raw).__name__}"
        raise InvalidMessage(message)
    chunk = raw.get("items")
    if chunk is None:
        return [_parse_one(raw, raw, "")]
    if not isinstance(chunk, list) or not chunk:
        message = f"items: field 'items' must be a non-empty list, got {type(chunk).__name__}"
        raise InvalidMessage(message)
    return [_parse_one(raw, item, f"items[{number}] ") for number, item in enumerate(chunk)]


def _parse_one(envelope: dict[str, Any], item: Any, where: str) -> tuple[str, int, int | None, bool, Any]:
    if not isinstance(item, dict):
        message = f"items: {where}must be a JSON object, got {type(item).__name__}"
        raise InvalidMessage(message)
    correlation_id = envelope.get("correlation_id")
    index = item.get("index")
    total = envelope.get("total")
    if not isinstance(correlation_id, str) or not correlation_id:
        message = f"items: field 'correlation_id' must be a non-empty string, got {correlation_id!r}"
        raise InvalidMessage(message)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        message = f"items: {where}item of {correlation_id!r} field 'index' must be a non-negative integer, got {index!r}"
        raise InvalidMessage(message)
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total <= index):
        message = f"items: {where}item {index} of {correlation_id!r} field 'total' must be an integer above the index, got {total!r}"
        raise InvalidMessage(message)
    return correlation_id, index, total, bool(item.get("last", False)), item.get("payload")


_process = load_processor(settings.item_processor)
_is_async = asyncio.iscoroutinefunction(_process)
_running = asyncio.Semaphore(max(1, settings.item_concurrency))


async def _run(payload: Any) -> StepOutcome:
    # an async step is bounded by item_concurrency; a sync one runs to the end anyway
    async with _running if _is_async else contextlib.nullcontext():
        return await run_with_retry(retry_policy, lambda: _process(payload))


@app.agent(topics.items, concurrency=settings.item_concurrency)
async def items(stream: StreamT[bytes]) -> None:
    """Runs the item step on every item of every item message (in batches); each message's outcomes go to the aggregator in one message."""
    await handle_events(stream, agent=AGENT, what="items: item", handler=_process_items, batched=True)


async def _process_items(event: EventT[bytes], raw: Any) -> None:
    parsed = parse_items(raw)
    if _is_async:  # an async step may wait (I/O): the items of a message run at once, up to item_concurrency per worker
        outcomes = await asyncio.gather(*(_run(payload) for _, _, _, _, payload in parsed))
    else:
        outcomes = [await _run(payload) for _, _, _, _, payload in parsed]
    correlation_id, total = parsed[0][0], parsed[0][2]
    results = []
    for (_, index, _, last, payload), outcome in zip(parsed, outcomes, strict=True):
        if not outcome.ok:
            error_text = f"item {index} of {correlation_id!r} failed after {outcome.attempts} attempts: {outcome.error}"
            # The dead letter holds the failed item alone, as a one-item message: it can be sent back to the items topic.
            single = {"correlation_id": correlation_id, "index": index, "total": total, "last": last, "payload": payload}
            await send_dead_letter(
                event, reason="failed", error=error_text, agent=AGENT, step="process", attempts=outcome.attempts, value=dumps(single)
            )
        results.append(
            {"index": index, "last": last, "ok": outcome.ok, "result": outcome.value, "error": outcome.error, "attempts": outcome.attempts}
        )
    if len(results) == 1:
        message = {"kind": "item", "correlation_id": correlation_id, "total": total, **results[0]}
    else:
        message = {"kind": "items", "correlation_id": correlation_id, "total": total, "items": results}
    await topics.item_results.send(key=correlation_id.encode(), value=dumps(message))
