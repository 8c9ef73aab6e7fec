"""Shop screens' days: each order id claimed once per screen's day; the day's claims dropped at its cleanup.

Why an order id is checked here. A line reaches the orders stage keyed by its ticket, so that any partition
can take it and a line that cannot even be read is still answered by its key; no orders partition sees a
screen's other lines, hence no other line with the same id. The orders stage sends each parsed order here
first, keyed by [screen, shard] (:func:`shop.state.claim_key`), so that every line with that id on that
screen's day lands on one key of one partition. The first line takes the id and its order goes on to the
payments and the dispatch (which asks the kitchen once the capture succeeded); a later line with the same id is
answered ``duplicate`` (dead letter ``duplicate-order``) before anything is charged or reserved. A record
delivered again is not a second line: under exactly_once it is never seen twice, and under at_least_once the
same ticket asking again gets its order sent again, which every later stage treats as the redelivery it is.

The day's end is the end-of-stream pattern's (shop/day.py): once the screen holds its report, the
controller's cleanup broadcast sends a ``cleanup`` to each of the screen's shards; each drops its ids and stays a
tombstone (a late claim is answered ``invalid``) for ``WEIR_EOF_CLOSED_RETENTION_MS``, then goes.
"""

from __future__ import annotations

from typing import Any

import orjson
from faust.types import EventT, StreamT

from shop.agents.common import outputs, send_all, shop_settings, shop_topics
from shop.cards import CardRef
from shop.state import (
    INVALID,
    MAX_ORDER_ID_CHARS,
    ClaimShard,
    ShopOrder,
    claim_key,
    claims_tombstone_due,
    is_positive_count,
    line_outcome,
    on_claims_cleanup,
    on_order,
    order_sends,
)
from shop.tables.order_ids import order_ids, order_ids_deadlines
from weir.app.core import InvalidMessage, app, handle_events, now_ms, record_limit, send_dead_letter, settings
from weir.app.deadlines import DeadlineIndex
from weir.app.runtime.keyed import Change, KeyedState, Refusal, TableStore
from weir.app.ticks import tick_every

__all__ = ["shop_claims"]

AGENT = "shop_claims"
#: The reason of a duplicate line's dead letter.
DUPLICATE_ORDER = "duplicate-order"
claims: KeyedState[ClaimShard] = KeyedState(
    agent=AGENT,
    store=TableStore(order_ids, ClaimShard.to_dict, ClaimShard.from_dict),
    deadlines=DeadlineIndex(order_ids_deadlines),
    step="order-id",
    deadline_kind="tombstone",
)


def read_claim(message: dict[str, Any]) -> tuple[str, int, ShopOrder]:
    """(ticket, line, order) of an order the orders stage sent to be claimed (its card a reference, never a number)."""
    screen, ticket, line, order = (message.get(name) for name in ("screen", "ticket", "line", "order"))
    if not isinstance(ticket, str) or not isinstance(line, int) or not is_positive_count(line) or not isinstance(order, dict):
        raise InvalidMessage(f"shop claims: order of screen {screen!r} needs 'ticket' (str), 'line' (int, from 1), 'order' (object)")
    order_id, card, scoops, amount = (order.get(name) for name in ("order_id", "card", "scoops", "amount_cents"))
    if not isinstance(order_id, str) or not 0 < len(order_id) <= MAX_ORDER_ID_CHARS or not isinstance(card, dict):
        raise InvalidMessage(
            f"shop claims: order of {ticket!r} needs 'order_id' (str, 1 to {MAX_ORDER_ID_CHARS} characters), 'card' (object)"
        )
    if not (isinstance(amount, int) and not isinstance(amount, bool) and amount >= 0) or not isinstance(scoops, dict) or not scoops:
        raise InvalidMessage(f"shop claims: order of {ticket!r} needs 'amount_cents' (int, at least 0) and 'scoops' (a non-empty object)")
    if not all(isinstance(flavour, str) and is_positive_count(count) for flavour, count in scoops.items()):
        raise InvalidMessage(f"shop claims: order of {ticket!r}: 'scoops' must map flavours to positive integers")
    try:
        reference = CardRef.from_dict(card)
    except ValueError as error:
        raise InvalidMessage(f"shop claims: order of {ticket!r}: {error}") from None
    return ticket, line, ShopOrder(order_id, reference, dict(scoops), amount)


async def _claim(event: EventT[bytes], screen: str, message: dict[str, Any]) -> None:
    ticket, line, order = read_claim(message)
    key = claim_key(screen, order.order_id)
    previous = claims.load(key)
    forward = order_sends(order, ticket, screen, line, now_ms() + shop_settings.dispatch_timeout_ms)
    shard, sends, duplicate = on_order(previous, screen, ticket, line, order.order_id, forward)
    if shard is not previous and claims.store.encoded_size(key, shard) > record_limit():
        # The shard cannot hold one more id (a day of some hundred thousand lines): the line is answered, not dropped.
        problem = f"screen {screen} line {line}: the day's order ids of shard {key} would exceed a record; the order is refused"
        await send_dead_letter(event, reason="invalid", error=problem, agent=AGENT, step="order-id")
        await send_all(event, line_outcome(ticket, screen, line, order.order_id, INVALID, problem), agent=AGENT)
        return
    refused = (Refusal(DUPLICATE_ORDER, duplicate),) if duplicate else ()
    await claims.apply(event, key, previous, Change(state=shard, outputs=outputs(sends), rejected=refused))


async def _cleanup(event: EventT[bytes]) -> None:
    """The end-of-stream controller's broadcast, keyed by the shard it is for: the shard becomes a tombstone."""
    key = event.message.key.decode("utf-8", "replace") if event.message.key else ""
    try:
        screen, shard = orjson.loads(key)
        if not isinstance(screen, str) or not isinstance(shard, int) or isinstance(shard, bool):
            raise ValueError(key)
    except ValueError:
        raise InvalidMessage(f"shop claims: a cleanup must be keyed by [screen, shard], got {key[:80]!r}") from None
    previous = claims.load(key)
    tombstone = on_claims_cleanup(previous, key, now_ms())
    due = claims_tombstone_due(tombstone, settings.eof_closed_retention_ms)
    await claims.apply(event, key, previous, Change(state=tombstone, deadlines=() if due is None or tombstone is previous else (due,)))


def _tombstone_gone(key: str, state: ClaimShard, now: int) -> Change[ClaimShard]:
    due = claims_tombstone_due(state, settings.eof_closed_retention_ms)
    return Change(state=None if due is not None and now >= due else state)


async def _owed(event: EventT[bytes], reason: str, error: str) -> None:
    """An order that could not be claimed (its message malformed, a step that kept failing): still its line's one outcome."""
    try:
        message = orjson.loads(event.message.value or b"")
    except orjson.JSONDecodeError:
        return  # not an order the orders stage sent (no ticket to answer): the dead letter is all there is
    if not isinstance(message, dict) or message.get("kind") != "order":
        return  # a cleanup or a tick: nothing is owed for those
    screen, ticket, line = message.get("screen"), message.get("ticket"), message.get("line")
    if isinstance(screen, str) and isinstance(ticket, str) and isinstance(line, int):
        await send_all(event, line_outcome(ticket, screen, line, None, INVALID, f"{reason}: {error[:300]}"), agent=AGENT)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict):
        raise InvalidMessage("shop claims: a message must be a JSON object")
    kind = message.get("kind")
    if kind == "order":
        screen = message.get("screen")
        if not isinstance(screen, str):
            raise InvalidMessage("shop claims: an order needs a string 'screen'")
        await _claim(event, screen, message)
    elif kind == "cleanup":
        await _cleanup(event)
    elif kind == "tick":
        due = lambda _kind, state: claims_tombstone_due(state, settings.eof_closed_retention_ms)  # noqa: E731
        await claims.walk_deadlines(event, now_ms(), due, _tombstone_gone)
    else:
        raise InvalidMessage(f"shop claims: 'kind' must be 'order', 'cleanup' or 'tick', got {kind!r:.60}")


@app.agent(shop_topics["claims"])
async def shop_claims(stream: StreamT[bytes]) -> None:
    """Reads each screen's orders to claim and its day's cleanups (keyed by [screen, shard]), and ticks."""
    await handle_events(stream, agent=AGENT, what="shop claims: message", handler=_handle, owed=_owed)


tick_every(shop_topics["claims"])
