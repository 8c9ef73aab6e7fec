"""Aggregator: merges item outcomes by correlation id; completes by count, last-flag or timeout."""

from __future__ import annotations

import logging
from typing import Any

from faust.types import EventT, StreamT

from app.codec import dumps
from app.core import InvalidMessage, app, handle_events, now_ms, send_dead_letter, settings, topics
from app.deadlines import DeadlineIndex, deadline_bucket
from app.ticks import tick_every
from tables.aggregates import (
    AggregatorConfig,
    DoneState,
    GroupState,
    ItemOutcome,
    Transition,
    on_expire,
    on_item,
    on_late_item,
    on_open,
)
from tables.aggregator_tables import deadlines, done_groups, open_groups

deadline_index = DeadlineIndex(deadlines)

__all__ = ["CONFIG", "late_items_total"]

log = logging.getLogger(__name__)
AGENT = "aggregator"
CONFIG = AggregatorConfig(
    name="order-items",
    timeout_ms=settings.aggregate_timeout_ms,
    done_retention_ms=settings.done_retention_ms,
)
#: Items that arrived after their group completed (counted, never merged); also per group in the table.
late_items_total = 0


async def _apply(event: EventT[bytes], correlation_id: str, transition: Transition, previous: GroupState | None) -> None:
    partition = event.message.partition
    if transition.rejected is not None:
        await send_dead_letter(event, reason="rejected", error=transition.rejected, agent=AGENT, step="merge")
    if transition.state is None:
        if previous is not None:
            del open_groups[correlation_id]
    elif transition.state != previous:
        open_groups[correlation_id] = transition.state.to_dict()
        if previous is None or previous.deadline_ms != transition.state.deadline_ms:
            deadline_index.add(partition, "group", correlation_id, transition.state.deadline_ms)
    if transition.done is not None:
        done_groups[correlation_id] = transition.done.to_dict()
        deadline_index.add(partition, "done", correlation_id, transition.done.expires_ms)
    for result in transition.emits:
        await topics.aggregates.send(key=correlation_id.encode(), value=dumps(result))


def _load(correlation_id: str) -> GroupState | None:
    raw = open_groups.get(correlation_id)
    return None if raw is None else GroupState.from_dict(raw)


async def _on_message(event: EventT[bytes], message: dict[str, Any], now: int) -> None:
    correlation_id = message.get("correlation_id")
    if not isinstance(correlation_id, str) or not correlation_id:
        raise InvalidMessage(f"aggregator: field 'correlation_id' must be a non-empty string, got {correlation_id!r}")
    kind = message.get("kind")
    if kind == "open":
        total = message.get("total")
        deadline_ms = message.get("deadline_ms")
        if not isinstance(deadline_ms, int) or not (total is None or (isinstance(total, int) and total > 0)):
            raise InvalidMessage(
                f"aggregator: 'open' of {correlation_id!r} needs an integer deadline_ms and a positive total, got {message!r:.200}"
            )
        if done_groups.get(correlation_id) is not None:
            return  # a redelivered open of a completed group
        previous = _load(correlation_id)
        await _apply(event, correlation_id, on_open(previous, correlation_id, total, deadline_ms, now, config=CONFIG), previous)
        return
    if kind == "item":
        await _merge(event, correlation_id, message, message.get("total"), now)
        return
    if kind != "items":
        raise InvalidMessage(f"aggregator: field 'kind' must be 'open', 'item', 'items' or 'tick', got {kind!r}")
    outcomes = message.get("items")
    if not isinstance(outcomes, list) or not outcomes or not all(isinstance(outcome, dict) for outcome in outcomes):
        raise InvalidMessage(f"aggregator: 'items' of {correlation_id!r} needs a non-empty list of objects, got {outcomes!r:.200}")
    for outcome in outcomes:
        await _merge(event, correlation_id, outcome, message.get("total"), now)


async def _merge(event: EventT[bytes], correlation_id: str, item: dict[str, Any], total: Any, now: int) -> None:
    """Merge one item's outcome into its group (or count it late when the group is done)."""
    global late_items_total
    index = item.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or not (total is None or isinstance(total, int)):
        raise InvalidMessage(f"aggregator: item of {correlation_id!r} needs an integer 'index' and 'total', got {index!r}, {total!r}")
    outcome = ItemOutcome(index=index, ok=bool(item.get("ok")), result=item.get("result"), error=item.get("error"))
    done_raw = done_groups.get(correlation_id)
    if done_raw is not None:
        done = DoneState.from_dict(done_raw)
        updated = on_late_item(done, index)
        if updated != done:
            late_items_total += 1
            done_groups[correlation_id] = updated.to_dict()
        return
    previous = _load(correlation_id)
    transition = on_item(previous, CONFIG, correlation_id, outcome, total, bool(item.get("last")), now)
    await _apply(event, correlation_id, transition, previous)


async def _on_tick(event: EventT[bytes], now: int) -> None:
    """Walks the deadline index from the last walked second to now: work per due entry, not per open group."""

    async def due(kind: str, correlation_id: str) -> bool:
        if kind == "group":
            state = _load(correlation_id)
            if state is None:
                return False  # completed by count or flag before its deadline
            if state.deadline_ms > now:
                # Later in this very second: look again next tick. A later second has its own entry.
                return deadline_bucket(state.deadline_ms) <= deadline_bucket(now)
            await _apply(event, correlation_id, on_expire(state, CONFIG, now), state)
            return False
        done_raw = done_groups.get(correlation_id)
        if done_raw is None:
            return False
        expires_ms = DoneState.from_dict(done_raw).expires_ms
        if expires_ms > now:
            return deadline_bucket(expires_ms) <= deadline_bucket(now)
        del done_groups[correlation_id]
        return False

    await deadline_index.walk(event.message.partition, now, due)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"aggregator: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    if message.get("kind") == "tick":
        await _on_tick(event, now)
    else:
        await _on_message(event, message, now)


@app.agent(topics.item_results)
async def aggregator(stream: StreamT[bytes]) -> None:
    """Reads 'open', 'item', 'items' (a chunk's outcomes) and 'tick' messages keyed by correlation id, in batches.

    A batch's part of a partition is one scope (``app.core.run_parts``): a group that gets ten outcomes in
    it is read once and written once.
    """
    await handle_events(stream, agent=AGENT, what="aggregator: message", handler=_handle, batched=True)


tick_every(topics.item_results)
