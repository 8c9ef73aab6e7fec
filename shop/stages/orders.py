"""Shop orders: a screen's line is read as an order and sent to claim its order id on the screen's day.

The claim (:mod:`shop.stages.claims`) sends the order on: a capture and an open at the dispatch barrier (the
dispatch asks the kitchen once the capture succeeded); or answers the line ``duplicate`` when an earlier line of
the screen took the id. The line's card is the reference the screen made of it (shop/cards.py); a line
written by something else may hold the number itself: it becomes a reference here, and every dead letter of this stage
(the line, or a record that cannot even be decoded) holds it masked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from faust.types import EventT

from shop.cards import mask_card_numbers
from shop.catalogue import CATALOGUE_CENTS
from shop.state import INVALID, Send, ShopOrder, claim_key, line_outcome, order_sends, parse_shop_order
from weir.app.errors import describe_error
from weir.app.runtime.keyed import prepare_outputs, send_prepared
from weir.app.shell import InvalidMessage, now_ms, record_limit, redact_dead_letters, send_dead_letter
from weir.app.stages import Stage, per_event

if TYPE_CHECKING:
    from shop.stages import ShopStages

__all__ = ["AGENT", "masked", "parse_envelope", "read_order", "ticket_parts", "orders_stage"]

AGENT = "shop_orders"


def masked(raw: bytes) -> bytes:
    """Bytes as a dead letter of this stage may hold them: every card number in them masked, other bytes as they came."""
    return mask_card_numbers(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def parse_envelope(message: Any) -> tuple[str, str, int, str | None, dict[str, Any] | None]:
    """(ticket, screen, line number, text, too_large) of a screen's message; ``text`` is None for a line too large to send."""
    if not isinstance(message, dict):
        raise InvalidMessage(f"shop orders: a screen message must be a JSON object, got {type(message).__name__}")
    ticket, screen, line, text = message.get("ticket"), message.get("screen"), message.get("line"), message.get("text")
    too_large = message.get("too_large")
    if isinstance(message.get("unreadable"), dict):  # not UTF-8 text: answered as unreadable, with why
        too_large = {"unreadable": message["unreadable"]}
    if not isinstance(ticket, str) or not isinstance(screen, str) or not isinstance(line, int):
        raise InvalidMessage("shop orders: a screen message needs 'ticket' (str), 'screen' (str), 'line' (int) and 'text' (str)")
    if not isinstance(text, str) and not isinstance(too_large, dict):
        raise InvalidMessage(f"shop orders: screen {screen} line {line}: 'text' must be a string, got {type(text).__name__}")
    return ticket, screen, line, text if isinstance(text, str) else None, too_large if isinstance(too_large, dict) else None


def ticket_parts(ticket: str) -> tuple[str, int] | None:
    """(screen, line) from a ticket ``<day>/<screen>/<line>`` (the record key a screen sends a line with)."""
    screen, _, line = ticket.rpartition("/")
    return (screen, int(line)) if screen and line.isdigit() else None


def read_order(text: str | None, too_large: dict[str, Any] | None, card_key: bytes) -> tuple[ShopOrder | None, str | None]:
    """The order on a line, or why there is none: whatever the line holds, this returns (the line's outcome is owed).
    ``card_key``: the key of the tokens of a card that came in clear."""
    if text is None and isinstance((too_large or {}).get("unreadable"), dict):
        unreadable = (too_large or {})["unreadable"]
        return None, f"unreadable line: {str(unreadable.get('reason'))[:300]} ({unreadable.get('size_bytes')} bytes)"
    if text is None:
        size = (too_large or {}).get("size_bytes")
        return None, f"line too large: {size} bytes, over the {(too_large or {}).get('limit_bytes')}-byte limit of a record"
    try:
        return parse_shop_order(text, CATALOGUE_CENTS, card_key)
    except Exception as error:  # a line may hold anything; its outcome is still owed
        return None, f"unreadable line: {describe_error(error)[:300]}"


def orders_stage(shop: ShopStages) -> Stage:
    """Reads the screens' lines (keyed by ticket)."""
    #: The key of the tokens of cards that reach this stage in clear (never from the screens): the configured one, or
    #: this process's own (a token then differs between workers, which decides nothing: the gateway never reads it).
    card_key = shop.shop.card_key.encode() or os.urandom(32)
    dispatch_timeout_ms = shop.shop.dispatch_timeout_ms
    # Whatever this stage dead-letters (a line, an undecodable record written by something other than a screen, its
    # key, headers or error) is stored masked.
    redact_dead_letters(AGENT, masked)

    async def send_invalid(event: EventT[bytes], ticket: str, screen: str, line: int, problem: str) -> None:
        await shop.send_all(event, line_outcome(ticket, screen, line, None, INVALID, problem), agent=AGENT)

    async def owed(event: EventT[bytes], reason: str, error: str) -> None:
        """A screen's line that could not be handled at all (undecodable, no envelope): still its one outcome, by its key."""
        ticket = event.message.key.decode("utf-8", "replace") if event.message.key else ""
        parts = ticket_parts(ticket)
        if parts is None:
            return  # not a screen's line (no ticket to answer): the dead letter is all there is
        screen, line = parts
        await send_invalid(event, ticket, screen, line, f"{reason}: {error[:300]}")

    async def take_order(event: EventT[bytes], message: Any) -> None:
        ticket, screen, line, text, too_large = parse_envelope(message)
        order, problem = read_order(text, too_large, card_key)
        if order is None:
            # The line is dead-lettered with its reason, and still gets its one outcome (counted as invalid).
            error = f"screen {screen} line {line}: {problem}"
            await send_dead_letter(event, reason="invalid", error=error, agent=AGENT, step="parse")
            await send_invalid(event, ticket, screen, line, str(problem))
            return
        # The gateway decides the card's fate (shop/stages/payments.py); only its reference goes on from here.
        order_fields = {
            "order_id": order.order_id,
            "card": order.card.to_dict(),
            "scoops": order.scoops,
            "amount_cents": order.amount_cents,
        }
        claim = {"kind": "order", "screen": screen, "ticket": ticket, "line": line, "order": order_fields}
        # What the claim will send is measured here too (its deadline as large as any), so that an order that
        # cannot go on is answered invalid now, not left without an outcome after its id was taken.
        forward = order_sends(order, ticket, screen, line, deadline_ms=now_ms() + dispatch_timeout_ms)
        sends = [Send("claims", claim_key(screen, order.order_id), claim), *forward]
        prepared = prepare_outputs(shop.outputs(sends), record_limit())
        if prepared.undeliverable:
            # The order cannot go on as it is (its open, say, would not fit a record): nothing of it is sent, the
            # line is dead-lettered and answered as invalid, as a line that does not parse.
            problem = f"the order cannot be forwarded: {prepared.undeliverable[0].problem}"
            error = f"screen {screen} line {line}: {problem}"
            await send_dead_letter(event, reason="invalid", error=error, agent=AGENT, step="forward")
            await send_invalid(event, ticket, screen, line, problem)
            return
        await send_prepared(prepared.ready[:1])  # the claim alone: it sends the rest once the id is the line's

    handler = per_event(agent=AGENT, what="shop orders: screen message", handler=take_order, owed=owed)
    return Stage(AGENT, (shop.topics["orders"],), handler)
