"""EOF aggregator: totals per flavour per client, merged once per batch id; flushes when the count is final."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import CATALOGUE, CONFIG, aggregate_topic, emit
from app.core import InvalidMessage, app, handle_events, now_ms, send_dead_letter
from app.deadlines import DeadlineIndex
from app.ticks import tick_every
from tables.eof import AggregatorTransition, ClientTotals, Order, on_aggregator_tick, on_batch, on_cleanup, on_finish
from tables.eof_aggregator_tables import totals, totals_deadlines

__all__ = ["eof_aggregator"]

AGENT = "eof_aggregator"
deadline_index = DeadlineIndex(totals_deadlines)


def _load(client: str) -> ClientTotals | None:
    raw = totals.get(client)
    return None if raw is None else ClientTotals.from_dict(raw)


async def _apply(event: EventT[bytes], client: str, previous: ClientTotals | None, transition: AggregatorTransition) -> None:
    if transition.rejected is not None:
        await send_dead_letter(event, reason="rejected", error=transition.rejected, agent=AGENT, step="merge")
    state = transition.state
    if state is None:
        if previous is not None:
            del totals[client]
    elif state != previous:
        totals[client] = state.to_dict()
        if previous is None or previous.closed_ms != state.closed_ms:
            deadline_index.add(event.message.partition, "client", client, state.deadline_ms(CONFIG))
    await emit(client, transition.emits)


async def _on_tick(event: EventT[bytes], now: int) -> None:
    def deadline_of(client: str) -> int | None:
        state = _load(client)
        return None if state is None else state.deadline_ms(CONFIG)

    async def expire(client: str) -> None:
        state = _load(client)
        if state is not None:
            await _apply(event, client, state, on_aggregator_tick(state, CONFIG, now))

    await deadline_index.walk_keys(event.message.partition, now, deadline_of, expire)


def _orders(message: dict[str, Any], client: str) -> list[Order]:
    try:
        return [Order.from_dict(raw) for raw in message["orders"]]
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidMessage(
            f"eof aggregator: batch {message.get('batch_id')!r} of client {client!r} has malformed orders ({error})"
        ) from None


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof aggregator: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await _on_tick(event, now)
        return
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof aggregator: 'client' must be a non-empty string, got {client!r:.60}")
    previous = _load(client)
    if kind == "batch":
        batch_id = message.get("batch_id")
        if not isinstance(batch_id, str) or not batch_id:
            raise InvalidMessage(f"eof aggregator: batch of client {client!r} needs a string 'batch_id', got {batch_id!r:.60}")
        transition = on_batch(previous, client, batch_id, _orders(message, client), CATALOGUE, now)
    elif kind == "finish":
        expected = message.get("expected")
        if not isinstance(expected, int) or isinstance(expected, bool) or expected < 0:
            raise InvalidMessage(f"eof aggregator: 'finish' of client {client!r} needs a non-negative integer 'expected'")
        transition = on_finish(previous, client, expected, CATALOGUE, now)
    elif kind == "cleanup":
        transition = on_cleanup(previous, client, now)
    else:
        raise InvalidMessage(f"eof aggregator: 'kind' must be 'batch', 'finish', 'cleanup' or 'tick', got {kind!r:.60}")
    await _apply(event, client, previous, transition)


@app.agent(aggregate_topic)
async def eof_aggregator(stream: StreamT[bytes]) -> None:
    """Reads forwarded batches, the controller's finish and cleanup, and ticks, keyed by client."""
    await handle_events(stream, agent=AGENT, what="eof aggregator: message", handler=_handle)


tick_every(aggregate_topic)
