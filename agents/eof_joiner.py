"""EOF joiner: joins a client's totals (from the aggregator) with its side data (from the gateway) into its report (the job's ``join``)."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import JOB, ClientStates, join_topic
from app.core import InvalidMessage, app, handle_events, now_ms
from app.ticks import tick_every
from tables.eof import ClientJoin, Totals, is_count, on_join_cleanup, on_joiner_tick, on_side, on_totals
from tables.eof_joiner_tables import joins, joins_deadlines

__all__ = ["eof_joiner"]

AGENT = "eof_joiner"
clients = ClientStates(joins, joins_deadlines, ClientJoin.from_dict, agent=AGENT, step="join")


def _totals(message: dict[str, Any], client: str) -> Totals:
    batches, records, error = message.get("batches"), message.get("records"), message.get("error")
    if not (isinstance(batches, int) and isinstance(records, int) and is_count(batches) and is_count(records)) or not (
        "totals" in message and (error is None or isinstance(error, str))
    ):
        raise InvalidMessage(
            f"eof joiner: totals of client {client!r} need 'batches' and 'records' (non-negative integers below 2**53), "
            "'totals' (the job's) and 'error' (null or a string)"
        )
    return Totals(batches, records, message["totals"], error)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof joiner: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await clients.tick(event, now, on_joiner_tick)
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof joiner: 'client' must be a non-empty string, got {client!r:.60}")
    previous = clients.load(client)
    if kind == "side":
        if "side" not in message:
            raise InvalidMessage(f"eof joiner: 'side' of client {client!r} needs 'side' (the client's side data, any JSON, null for none)")
        transition = on_side(previous, client, message["side"], now, JOB)
    elif kind == "totals":
        transition = on_totals(previous, client, _totals(message, client), now, JOB)
    elif kind == "cleanup":
        transition = on_join_cleanup(previous, client, now)
    else:
        raise InvalidMessage(f"eof joiner: 'kind' must be 'side', 'totals', 'cleanup' or 'tick', got {kind!r:.60}")
    await clients.apply(event, client, previous, transition)


@app.agent(join_topic)
async def eof_joiner(stream: StreamT[bytes]) -> None:
    """Reads each client's side data, its totals, the controller's cleanup, and ticks, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof joiner: message", handler=_handle)


tick_every(join_topic)
