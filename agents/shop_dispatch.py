"""Shop dispatch: each order's two-phase commit. The capture first; once captured, the kitchen's reservations; then
deliver and commit, or void and restock. A rejected card aborts the order before any robot hears of it."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import outputs, shop_topics
from app.core import InvalidMessage, app, handle_events, now_ms, settings
from app.deadlines import DeadlineIndex
from app.runtime.keyed import Change, KeyedState, TableStore
from app.ticks import tick_every
from tables.shop import Dispatch, DispatchDone, DispatchState, OpenedOrder, Send, on_dispatch_tick, on_kitchen, on_open, on_payment
from tables.shop_dispatch_tables import dispatch, dispatch_deadlines

__all__ = ["shop_dispatch"]

AGENT = "shop_dispatch"
#: how long answers for an order whose open never came are kept (a stray message)
PLACEHOLDER_TIMEOUT_MS = 60_000


def _decode(raw: Any) -> DispatchState:
    return DispatchDone.from_dict(raw) if raw.get("done") else Dispatch.from_dict(raw)


def _encode(state: DispatchState) -> Any:
    return state.to_dict()


orders: KeyedState[DispatchState] = KeyedState(
    agent=AGENT,
    store=TableStore(dispatch, _encode, _decode),
    deadlines=DeadlineIndex(dispatch_deadlines),
    step="dispatch",
    deadline_kind="order",
)


def _due_ms(state: DispatchState) -> int:
    if isinstance(state, DispatchDone):
        return state.resolved_ms + settings.done_retention_ms
    return state.deadline_ms if state.opened else state.deadline_ms + PLACEHOLDER_TIMEOUT_MS


def _change(previous: DispatchState | None, state: DispatchState | None, sends: list[Send]) -> Change[DispatchState]:
    """The core's answer as the runtime's change: the order's deadline is filed when its kind or its due time moved."""
    moved = state is not None and (previous is None or type(previous) is not type(state) or _due_ms(previous) != _due_ms(state))
    return Change(state=state, outputs=outputs(sends), deadlines=(_due_ms(state),) if moved and state is not None else ())


async def _on_tick(event: EventT[bytes], now: int) -> None:
    def on_deadline(order_id: str, state: DispatchState, now_ms: int) -> Change[DispatchState]:
        updated, sends = on_dispatch_tick(state, now_ms, settings.done_retention_ms, PLACEHOLDER_TIMEOUT_MS)
        return _change(state, updated, sends)

    await orders.walk_deadlines(event, now, lambda _kind, state: _due_ms(state), on_deadline)


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
    previous = orders.load(order_id)
    if kind == "open":
        try:
            raw = message["order"]
            # keyed, paid and reserved by its ticket (the message's order_id), not by the customer's order id
            order = OpenedOrder(order_id, {str(f): int(n) for f, n in raw["scoops"].items()}, int(raw["amount_cents"]))
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
        reason = message.get("reason")
        state, sends = on_payment(previous, order_id, _flag(message, "ok"), now, reason if isinstance(reason, str) else None)
    else:
        raise InvalidMessage(f"shop dispatch: 'kind' must be 'open', 'kitchen', 'payment' or 'tick', got {kind!r:.60}")
    await orders.apply(event, order_id, previous, _change(previous, state, sends))


@app.agent(shop_topics["dispatch"])
async def shop_dispatch(stream: StreamT[bytes]) -> None:
    """Reads opens, the kitchen's and the payment's answers, and ticks, keyed by order ticket."""
    await handle_events(stream, agent=AGENT, what="shop dispatch: message", handler=_handle)


tick_every(shop_topics["dispatch"])
