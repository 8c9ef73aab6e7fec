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

A keyed logic (:func:`weir.app.keyed_stage.keyed_stage`): one state per [screen, shard], a tombstone's deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from faust.types import EventT

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
from weir.app.keyed_stage import KeyedLogic, keyed_stage
from weir.app.runtime.keyed import Change, Refusal
from weir.app.shell import InvalidMessage, record_limit
from weir.app.stages import Stage

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["AGENT", "DUPLICATE_ORDER", "ORDER_IDS_TABLE", "claims_stage", "read_claim"]

AGENT = "shop_claims"
#: The reason of a duplicate line's dead letter.
DUPLICATE_ORDER = "duplicate-order"
#: The order ids' table and its deadline index: names and help texts.
ORDER_IDS_TABLE = (
    "shop_order_ids",
    "Order ids taken on a screen's day, keyed by [screen, shard]: each id with the ticket and line that took it; a "
    "later line with the same id is answered 'duplicate' and never charged. The day's cleanup leaves each shard a "
    "tombstone for WEIR_EOF_CLOSED_RETENTION_MS, then it goes (value: shop.state.ClaimShard).",
)
ORDER_IDS_DEADLINES = (
    "shop_order_ids_deadlines",
    "Deadline index of the order ids (app.deadlines.DeadlineIndex): tombstones of cleaned-up days to drop.",
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


def _key_of(message: Any, record_key: str) -> str:
    """An order's shard ([screen, shard] of its id); a cleanup's, from its record's key."""
    if not isinstance(message, dict):
        raise InvalidMessage("shop claims: a message must be a JSON object")
    if message.get("kind") == "cleanup":
        try:
            screen, shard = orjson.loads(record_key)
            if not isinstance(screen, str) or not isinstance(shard, int) or isinstance(shard, bool):
                raise ValueError(record_key)
        except ValueError:
            raise InvalidMessage(f"shop claims: a cleanup must be keyed by [screen, shard], got {record_key[:80]!r}") from None
        return record_key
    if message.get("kind") != "order":
        return record_key  # no transition takes it: the stage refuses its kind
    screen = message.get("screen")
    if not isinstance(screen, str):
        raise InvalidMessage("shop claims: an order needs a string 'screen'")
    _, _, order = read_claim(message)
    return claim_key(screen, order.order_id)


def claims_stage(shop: ShopStages) -> Stage:
    """Reads each screen's orders to claim and its day's cleanups (keyed by [screen, shard]), and ticks."""
    retention_ms = shop.settings.eof_closed_retention_ms
    dispatch_timeout_ms = shop.shop.dispatch_timeout_ms

    def claim(previous: ClaimShard | None, key: str, message: dict[str, Any], now: int) -> Change[ClaimShard]:
        screen: str = message["screen"]
        ticket, line, order = read_claim(message)
        forward = order_sends(order, ticket, screen, line, now + dispatch_timeout_ms)
        shard, sends, duplicate = on_order(previous, screen, ticket, line, order.order_id, forward)
        if shard is not previous and keyed.store.encoded_size(key, shard) > record_limit():
            # The shard cannot hold one more id (a day of some hundred thousand lines): the line is answered, not dropped.
            problem = f"screen {screen} line {line}: the day's order ids of shard {key} would exceed a record; the order is refused"
            outcome = line_outcome(ticket, screen, line, order.order_id, INVALID, problem)
            return Change(state=previous, outputs=shop.outputs(outcome), rejected=(Refusal("invalid", problem),))
        refused = (Refusal(DUPLICATE_ORDER, duplicate),) if duplicate else ()
        return Change(state=shard, outputs=shop.outputs(sends), rejected=refused)

    def cleanup(previous: ClaimShard | None, key: str, message: dict[str, Any], now: int) -> Change[ClaimShard]:
        """The end-of-stream controller's broadcast, keyed by the shard it is for: the shard becomes a tombstone."""
        tombstone = on_claims_cleanup(previous, key, now)
        due = claims_tombstone_due(tombstone, retention_ms)
        return Change(state=tombstone, deadlines=() if due is None or tombstone is previous else (due,))

    def tombstone_gone(key: str, state: ClaimShard, now: int) -> Change[ClaimShard]:
        due = claims_tombstone_due(state, retention_ms)
        return Change(state=None if due is not None and now >= due else state)

    async def owed(event: EventT[bytes], reason: str, error: str) -> None:
        """An order that could not be claimed (its message malformed, a step that kept failing): still its line's one outcome."""
        try:
            message = orjson.loads(event.message.value or b"")
        except orjson.JSONDecodeError:
            return  # not an order the orders stage sent (no ticket to answer): the dead letter is all there is
        if not isinstance(message, dict) or message.get("kind") != "order":
            return  # a cleanup or a tick: nothing is owed for those
        screen, ticket, line = message.get("screen"), message.get("ticket"), message.get("line")
        if isinstance(screen, str) and isinstance(ticket, str) and isinstance(line, int):
            await shop.send_all(event, line_outcome(ticket, screen, line, None, INVALID, f"{reason}: {error[:300]}"), agent=AGENT)

    logic: KeyedLogic[ClaimShard] = KeyedLogic(
        name=AGENT,
        key_of=_key_of,
        on_message={"order": claim, "cleanup": cleanup},
        encode=ClaimShard.to_dict,
        decode=ClaimShard.from_dict,
        due_ms=lambda _kind, state: claims_tombstone_due(state, retention_ms),
        on_deadline=tombstone_gone,
        step="order-id",
        deadline_kind="tombstone",
        label="shop claims",
        owed=owed,
    )
    stage, keyed = keyed_stage(logic, shop.wiring, source=shop.topics["claims"], table=ORDER_IDS_TABLE, deadlines=ORDER_IDS_DEADLINES)
    return stage
