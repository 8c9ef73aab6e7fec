"""EOF group-by/aggregate stage: the job's totals per client, merged once per batch id; flushed to the joiner when the count is final."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import JOB, ClientStates, aggregate_topic
from app.core import InvalidMessage, app, handle_events, now_ms
from app.ticks import tick_every
from tables.eof import ClientTotals, on_aggregator_tick, on_batch, on_cleanup, on_finish
from tables.eof_aggregator_tables import totals, totals_deadlines

__all__ = ["eof_aggregator"]

AGENT = "eof_aggregator"
clients = ClientStates(totals, totals_deadlines, ClientTotals.from_dict, agent=AGENT, step="merge")


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof aggregator: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await clients.tick(event, now, on_aggregator_tick)
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof aggregator: 'client' must be a non-empty string, got {client!r:.60}")
    previous = clients.load(client)
    if kind == "batch":
        batch_id = message.get("batch_id")
        if not isinstance(batch_id, str) or not batch_id:
            raise InvalidMessage(f"eof aggregator: batch of client {client!r} needs a string 'batch_id', got {batch_id!r:.60}")
        records = message.get("records")
        if not isinstance(records, list):
            raise InvalidMessage(f"eof aggregator: batch {batch_id!r} of client {client!r} needs 'records', a list")
        transition = on_batch(previous, client, batch_id, records, now, JOB)
    elif kind == "finish":
        expected = message.get("expected")
        if not isinstance(expected, int) or isinstance(expected, bool) or expected < 0:
            raise InvalidMessage(f"eof aggregator: 'finish' of client {client!r} needs a non-negative integer 'expected'")
        transition = on_finish(previous, client, expected, now, JOB)
    elif kind == "cleanup":
        transition = on_cleanup(previous, client, now)
    else:
        raise InvalidMessage(f"eof aggregator: 'kind' must be 'batch', 'finish', 'cleanup' or 'tick', got {kind!r:.60}")
    await clients.apply(event, client, previous, transition)


@app.agent(aggregate_topic)
async def eof_aggregator(stream: StreamT[bytes]) -> None:
    """Reads forwarded batches, the controller's finish and cleanup, and ticks, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof aggregator: message", handler=_handle)


tick_every(aggregate_topic)
