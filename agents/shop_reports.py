"""Shop screens' days: each order id claimed once per screen, outcomes counted once per line, the report at the end.

Why an order id is checked here. A line reaches the orders stage keyed by its ticket, so that any partition
can take it and a line that cannot even be read is still answered by its key; no orders partition sees a
screen's other lines, hence no other line with the same id. This stage already keeps a screen's day (its
report, keyed by screen); the orders stage sends each parsed order here first, keyed by [screen, order id], so
that every line with that id on that screen's day lands on one key of one partition. The first line takes the
id and its order goes on to the payments and the dispatch (which asks the kitchen once the capture succeeded);
a later line with the same id is answered ``duplicate`` (dead letter ``duplicate-order``) before anything is
charged or reserved. A record delivered again is not a second line: under exactly_once it is never seen twice,
and under at_least_once the same ticket asking again gets its order sent again, which every later stage treats
as the redelivery it is.
"""

from __future__ import annotations

from typing import Any

import orjson
from faust.types import EventT, StreamT

from agents.shop_common import outputs, send_all, shop_topics
from app.core import InvalidMessage, app, handle_events, now_ms, settings
from app.runtime.keyed import Change, KeyedState, Refusal, TableStore
from tables.shop import INVALID, OrderClaim, ScreenReport, ShopOrder, claim_key, line_outcome, on_end, on_order, on_outcome, order_sends
from tables.shop_cards import CardRef
from tables.shop_order_tables import order_ids
from tables.shop_report_tables import reports

__all__ = ["shop_reports"]

AGENT = "shop_reports"
#: The reason of a duplicate line's dead letter.
DUPLICATE_ORDER = "duplicate-order"
screens: KeyedState[ScreenReport] = KeyedState(
    agent=AGENT, store=TableStore(reports, ScreenReport.to_dict, ScreenReport.from_dict), step="report"
)
claims: KeyedState[OrderClaim] = KeyedState(
    agent=AGENT, store=TableStore(order_ids, OrderClaim.to_dict, OrderClaim.from_dict), step="order-id"
)


def read_claim(message: dict[str, Any]) -> tuple[str, int, ShopOrder]:
    """(ticket, line, order) of an order the orders stage sent to be claimed (its card a reference, never a number)."""
    screen, ticket, line, order = (message.get(name) for name in ("screen", "ticket", "line", "order"))
    if not isinstance(ticket, str) or not isinstance(line, int) or not isinstance(order, dict):
        raise InvalidMessage(f"shop reports: order of screen {screen!r} needs 'ticket' (str), 'line' (int), 'order' (object)")
    order_id, card, scoops, amount = (order.get(name) for name in ("order_id", "card", "scoops", "amount_cents"))
    if not isinstance(order_id, str) or not isinstance(card, dict) or not isinstance(amount, int) or not isinstance(scoops, dict):
        needs = "'order_id' (str), 'card' (object: token, last4, luhn_ok), 'scoops' (object), 'amount_cents' (int)"
        raise InvalidMessage(f"shop reports: order of {ticket!r} needs {needs}")
    if not all(isinstance(flavour, str) and isinstance(count, int) for flavour, count in scoops.items()):
        raise InvalidMessage(f"shop reports: order of {ticket!r}: 'scoops' must map flavours to integers")
    try:
        reference = CardRef.from_dict(card)
    except ValueError as error:
        raise InvalidMessage(f"shop reports: order of {ticket!r}: {error}") from None
    return ticket, line, ShopOrder(order_id, reference, dict(scoops), amount)


async def _claim(event: EventT[bytes], screen: str, message: dict[str, Any]) -> None:
    ticket, line, order = read_claim(message)
    key = claim_key(screen, order.order_id)
    previous = claims.load(key)
    forward = order_sends(order, ticket, screen, line, now_ms() + settings.shop_dispatch_timeout_ms)
    claim, sends, duplicate = on_order(previous, screen, ticket, line, order.order_id, forward)
    refused = (Refusal(DUPLICATE_ORDER, duplicate),) if duplicate else ()
    await claims.apply(event, key, previous, Change(state=claim, outputs=outputs(sends), rejected=refused))


async def _owed(event: EventT[bytes], reason: str, error: str) -> None:
    """An order that could not be claimed (its message malformed, a step that kept failing): still its line's one outcome."""
    try:
        message = orjson.loads(event.message.value or b"")
    except orjson.JSONDecodeError:
        return  # not an order the orders stage sent (no ticket to answer): the dead letter is all there is
    if not isinstance(message, dict) or message.get("kind") != "order":
        return  # an outcome or an end of day: nothing is owed for those
    screen, ticket, line = message.get("screen"), message.get("ticket"), message.get("line")
    if isinstance(screen, str) and isinstance(ticket, str) and isinstance(line, int):
        await send_all(event, line_outcome(ticket, screen, line, None, INVALID, f"{reason}: {error[:300]}"), agent=AGENT)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("screen"), str):
        raise InvalidMessage("shop reports: a message must be a JSON object with a string 'screen'")
    screen = message["screen"]
    kind = message.get("kind")
    if kind == "order":
        await _claim(event, screen, message)
        return
    previous = screens.load(screen)
    if kind == "outcome":
        line, status, amount = message.get("line"), message.get("status"), message.get("amount_cents")
        if not isinstance(line, int) or not isinstance(status, str) or not isinstance(amount, int):
            raise InvalidMessage(f"shop reports: outcome of screen {screen!r} needs 'line' (int), 'status' (str), 'amount_cents' (int)")
        state, sends = on_outcome(previous, screen, line, status, message.get("reason"), amount)
    elif kind == "end":
        lines = message.get("lines")
        if not isinstance(lines, int) or lines < 0:
            raise InvalidMessage(f"shop reports: end of screen {screen!r} needs a non-negative integer 'lines'")
        state, sends = on_end(previous, screen, lines)
    else:
        raise InvalidMessage(f"shop reports: 'kind' must be 'order', 'outcome' or 'end', got {kind!r:.60}")
    await screens.apply(event, screen, previous, Change(state=state, outputs=outputs(sends)))


@app.agent(shop_topics["screens"])
async def shop_reports(stream: StreamT[bytes]) -> None:
    """Reads each screen's orders (keyed by [screen, order id]), its lines' outcomes and its end of day (keyed by screen)."""
    await handle_events(stream, agent=AGENT, what="shop reports: message", handler=_handle, owed=_owed)
