"""EOF controller: counts a client's batches by id; tells the aggregator when the count is final; cleans up."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import CONFIG, counter_topic, emit
from app.core import InvalidMessage, app, handle_events, now_ms, send_dead_letter
from app.deadlines import DeadlineIndex
from app.ticks import tick_every
from tables.eof import ControllerState, ControllerTransition, on_controller_tick, on_delivered, on_report, on_sent
from tables.eof_controller_tables import counter_deadlines, counters

__all__ = ["eof_controller"]

AGENT = "eof_controller"
deadline_index = DeadlineIndex(counter_deadlines)


def _load(client: str) -> ControllerState | None:
    raw = counters.get(client)
    return None if raw is None else ControllerState.from_dict(raw)


def _count(message: dict[str, Any], field: str, client: str) -> int:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidMessage(f"eof controller: {message.get('kind')!r} of client {client!r} needs a non-negative integer {field!r}")
    return value


async def _apply(event: EventT[bytes], client: str, previous: ControllerState | None, transition: ControllerTransition) -> None:
    if transition.rejected is not None:
        await send_dead_letter(event, reason="rejected", error=transition.rejected, agent=AGENT, step="count")
    state = transition.state
    if state is None:
        if previous is not None:
            del counters[client]
    elif state != previous:
        counters[client] = state.to_dict()
        if previous is None or previous.closed_ms != state.closed_ms:
            # one index entry per client at a time: a tick re-files it if activity moved the deadline
            deadline_index.add(event.message.partition, "client", client, state.deadline_ms(CONFIG))
    await emit(client, transition.emits)


async def _on_tick(event: EventT[bytes], now: int) -> None:
    def deadline_of(client: str) -> int | None:
        state = _load(client)
        return None if state is None else state.deadline_ms(CONFIG)

    async def expire(client: str) -> None:
        state = _load(client)
        if state is not None:
            await _apply(event, client, state, on_controller_tick(state, CONFIG, now))

    await deadline_index.walk_keys(event.message.partition, now, deadline_of, expire)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof controller: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await _on_tick(event, now)
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof controller: 'client' must be a non-empty string, got {client!r:.60}")
    previous = _load(client)
    if kind == "sent":
        transition = on_sent(previous, client, _count(message, "batches", client), now)
    elif kind == "filtered":
        transition = on_report(previous, client, _count(message, "batch_id", client), _count(message, "forwarded", client), now)
    elif kind == "delivered":
        transition = on_delivered(previous, client, now)
    else:
        raise InvalidMessage(f"eof controller: 'kind' must be 'sent', 'filtered', 'delivered' or 'tick', got {kind!r:.60}")
    await _apply(event, client, previous, transition)


@app.agent(counter_topic)
async def eof_controller(stream: StreamT[bytes]) -> None:
    """Reads the gateway's and the filters' counter messages, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof controller: message", handler=_handle)


tick_every(counter_topic)
