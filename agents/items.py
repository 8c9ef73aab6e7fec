"""Per-item workers: run the item step (a user function) with retries; report each item's outcome."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from faust.types import EventT, StreamT

from app.catalogue import CATALOGUE_CENTS
from app.codec import dumps
from app.core import InvalidMessage, app, handle_events, retry_policy, send_dead_letter, settings, topics
from app.errors import run_with_retry

__all__ = ["parse_item", "price_item", "load_processor", "CATALOGUE_CENTS"]

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


def parse_item(raw: Any) -> tuple[str, int, int | None, bool, Any]:
    """(correlation id, index, total, last, payload) of an item message, or :class:`InvalidMessage`."""
    if not isinstance(raw, dict):
        message = f"items: an item message must be a JSON object, got {type(raw).__name__}"
        raise InvalidMessage(message)
    correlation_id = raw.get("correlation_id")
    index = raw.get("index")
    total = raw.get("total")
    if not isinstance(correlation_id, str) or not correlation_id:
        message = f"items: field 'correlation_id' must be a non-empty string, got {correlation_id!r}"
        raise InvalidMessage(message)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        message = f"items: item of {correlation_id!r} field 'index' must be a non-negative integer, got {index!r}"
        raise InvalidMessage(message)
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total <= index):
        message = f"items: item {index} of {correlation_id!r} field 'total' must be an integer above the index, got {total!r}"
        raise InvalidMessage(message)
    return correlation_id, index, total, bool(raw.get("last", False)), raw.get("payload")


_process = load_processor(settings.item_processor)


@app.agent(topics.items, concurrency=settings.item_concurrency)
async def items(stream: StreamT[bytes]) -> None:
    """Runs the item step on every item; its outcome (ok or failed after retries) goes to the aggregator."""
    await handle_events(stream, agent=AGENT, what="items: item", handler=_process_item)


async def _process_item(event: EventT[bytes], raw: Any) -> None:
    correlation_id, index, total, last, payload = parse_item(raw)
    outcome = await run_with_retry(retry_policy, lambda: _process(payload))
    if not outcome.ok:
        error_text = f"item {index} of {correlation_id!r} failed after {outcome.attempts} attempts: {outcome.error}"
        await send_dead_letter(event, reason="failed", error=error_text, agent=AGENT, step="process", attempts=outcome.attempts)
    result = {
        "kind": "item",
        "correlation_id": correlation_id,
        "index": index,
        "total": total,
        "last": last,
        "ok": outcome.ok,
        "result": outcome.value,
        "error": outcome.error,
        "attempts": outcome.attempts,
    }
    await (await topics.item_results.send(key=correlation_id.encode(), value=dumps(result)))
