"""EOF controller: counts a client's batches by id; tells the aggregator when the count is final; cleans up."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import JOB, ClientStates, counter_topic
from app.core import InvalidMessage, app, handle_events, now_ms
from app.ticks import tick_every
from tables.eof import ControllerState, on_controller_tick, on_delivered, on_report, on_sent
from tables.eof_controller_tables import counter_deadlines, counters

__all__ = ["eof_controller"]

AGENT = "eof_controller"
clients = ClientStates(counters, counter_deadlines, ControllerState.from_dict, agent=AGENT, step="count")


def _count(message: dict[str, Any], field: str, client: str) -> int:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidMessage(f"eof controller: {message.get('kind')!r} of client {client!r} needs a non-negative integer {field!r}")
    return value


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof controller: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await clients.tick(event, now, lambda state, config, at: on_controller_tick(state, config, at, JOB))
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof controller: 'client' must be a non-empty string, got {client!r:.60}")
    previous = clients.load(client)
    if kind == "sent":
        transition = on_sent(previous, client, _count(message, "batches", client), now)
    elif kind == "filtered":
        transition = on_report(previous, client, _count(message, "batch_id", client), _count(message, "forwarded", client), now)
    elif kind == "delivered":
        transition = on_delivered(previous, client, now, JOB)
    else:
        raise InvalidMessage(f"eof controller: 'kind' must be 'sent', 'filtered', 'delivered' or 'tick', got {kind!r:.60}")
    await clients.apply(event, client, previous, transition)


@app.agent(counter_topic)
async def eof_controller(stream: StreamT[bytes]) -> None:
    """Reads the gateway's and the filters' counter messages, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof controller: message", handler=_handle)


tick_every(counter_topic)
