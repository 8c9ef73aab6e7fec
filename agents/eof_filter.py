"""EOF filter stage: drops invalid orders, forwards, splits or drops each batch, and reports what it forwarded."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import CATALOGUE, HOURS, aggregate_topic, batches_topic, counter_topic
from app.codec import dumps
from app.core import InvalidMessage, app, handle_events, settings
from tables.eof import filter_batch

__all__ = ["eof_filter"]

AGENT = "eof_filter"


def _parse_batch(message: Any) -> tuple[str, int, list[str]]:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof filter: a batch must be a JSON object, got {type(message).__name__}")
    client, batch_id, lines = message.get("client"), message.get("batch_id"), message.get("lines")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof filter: 'client' must be a non-empty string, got {client!r:.60}")
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise InvalidMessage(f"eof filter: batch of client {client!r} needs a non-negative integer 'batch_id', got {batch_id!r:.60}")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise InvalidMessage(f"eof filter: batch {batch_id} of client {client!r} needs 'lines', a list of strings")
    return client, batch_id, lines


async def _filter(event: EventT[bytes], message: Any) -> None:
    client, batch_id, lines = _parse_batch(message)
    outcome = filter_batch(batch_id, lines, CATALOGUE, HOURS, settings.eof_max_batch_orders)
    key = client.encode()
    sent = []
    for out_id, orders in outcome.forwarded:
        batch = {"kind": "batch", "client": client, "batch_id": out_id, "orders": [order.to_dict() for order in orders]}
        sent.append(await aggregate_topic.send(key=key, value=dumps(batch)))
    # The report goes in the same transaction as the forwarded batches and this batch's offset.
    report = {
        "kind": "filtered",
        "client": client,
        "batch_id": batch_id,
        "forwarded": len(outcome.forwarded),
        "dropped": len(outcome.dropped),
    }
    sent.append(await counter_topic.send(key=key, value=dumps(report)))
    for future in sent:
        await future


@app.agent(batches_topic)
async def eof_filter(stream: StreamT[bytes]) -> None:
    """Reads a client's batches (keyed client/batch, so any filter worker may get any batch of a client)."""
    await handle_events(stream, agent=AGENT, what="eof filter: batch", handler=_filter)
