"""Shop dispatch: a barrier on the kitchen and the payment of each order; then deliver and commit, or void and restock."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import send_all, shop_topics
from app.core import InvalidMessage, app, handle_events, now_ms, settings
from app.deadlines import DeadlineIndex
from app.ticks import tick_every
from tables.shop import Dispatch, DispatchDone, DispatchState, ShopOrder, on_dispatch_tick, on_kitchen, on_open, on_payment
from tables.shop_dispatch_tables import dispatch, dispatch_deadlines

__all__ = ["shop_dispatch"]

AGENT = "shop_dispatch"
deadline_index = DeadlineIndex(dispatch_deadlines)
#: how long answers for an order whose open never came are kept (a stray message)
PLACEHOLDER_TIMEOUT_MS = 60_000


def _load(order_id: str) -> DispatchState | None:
    raw = dispatch.get(order_id)
    if raw is None:
        return None
    return DispatchDone.from_dict(raw) if raw.get("done") else Dispatch.from_dict(raw)


def _due_ms(state: DispatchState) -> int:
    if isinstance(state, DispatchDone):
        return state.resolved_ms + settings.done_retention_ms
    return state.deadline_ms if state.opened else state.deadline_ms + PLACEHOLDER_TIMEOUT_MS


async def _store(event: EventT[bytes], order_id: str, previous: DispatchState | None, state: DispatchState | None) -> None:
    if state is None:
        if previous is not None:
            del dispatch[order_id]
        return
    if state == previous:
        return
    dispatch[order_id] = state.to_dict()
    if previous is None or type(previous) is not type(state) or _due_ms(previous) != _due_ms(state):
        deadline_index.add(event.message.partition, "order", order_id, _due_ms(state))


async def _on_tick(event: EventT[bytes], now: int) -> None:
    def deadline_of(order_id: str) -> int | None:
        state = _load(order_id)
        return None if state is None else _due_ms(state)

    async def expire(order_id: str) -> None:
        state = _load(order_id)
        if state is not None:
            updated, sends = on_dispatch_tick(state, now, settings.done_retention_ms, PLACEHOLDER_TIMEOUT_MS)
            await _store(event, order_id, state, updated)
            await send_all(sends)

    await deadline_index.walk_keys(event.message.partition, now, deadline_of, expire)


def _flag(message: dict[str, Any], name: str) -> bool:
    value = message.get(name)
    if not isinstance(value, bool):
        raise InvalidMessage(f"shop dispatch: {message.get('kind')!r} of {message.get('order_id')!r} needs a boolean {name!r}")
    return value


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage(f"shop dispatch: a message must be a JSON object, got {type(message).__name__}")
    now = now_ms()
    kind = message.get("kind")
    if kind == "tick":
        await _on_tick(event, now)
        return
    order_id = message.get("order_id")
    if not isinstance(order_id, str) or not order_id:
        raise InvalidMessage(f"shop dispatch: 'order_id' must be a non-empty string, got {order_id!r:.60}")
    previous = _load(order_id)
    if kind == "open":
        try:
            raw = message["order"]
            order = ShopOrder(order_id, str(raw["card"]), {str(f): int(n) for f, n in raw["scoops"].items()}, int(raw["amount_cents"]))
            ticket, screen, line, deadline = (
                str(message["ticket"]),
                str(message["screen"]),
                int(message["line"]),
                int(message["deadline_ms"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise InvalidMessage(f"shop dispatch: malformed open of {order_id!r} ({error!r})") from None
        state, sends = on_open(previous, order, ticket, screen, line, deadline, now)
    elif kind == "kitchen":
        flavour = message.get("flavour")
        if not isinstance(flavour, str):
            raise InvalidMessage(f"shop dispatch: kitchen answer of {order_id!r} needs a string 'flavour'")
        state, sends = on_kitchen(previous, order_id, flavour, _flag(message, "ok"), now)
    elif kind == "payment":
        state, sends = on_payment(previous, order_id, _flag(message, "ok"), now)
    else:
        raise InvalidMessage(f"shop dispatch: 'kind' must be 'open', 'kitchen', 'payment' or 'tick', got {kind!r:.60}")
    await _store(event, order_id, previous, state)
    await send_all(sends)


@app.agent(shop_topics["dispatch"])
async def shop_dispatch(stream: StreamT[bytes]) -> None:
    """Reads opens, the kitchen's and the payment's answers, and ticks, keyed by order ticket."""
    await handle_events(stream, agent=AGENT, what="shop dispatch: message", handler=_handle)


tick_every(shop_topics["dispatch"])
