"""The ice-cream shop's state: typed values of its tables and their pure cores (payments, stock, dispatch, reports).

The seed's shop (screens, a Bully-elected leader, robots passing flavour tokens, a payment gateway with
two-phase commit) rebuilt as streams. A card number never reaches this module's messages: a line's card is a
:class:`~tables.shop_cards.CardRef` (token, last four digits, Luhn fact) from the screen that read it. Every
message is keyed so that one partition owns each piece of state: an order's payment and dispatch by order id,
a flavour's stock by flavour (the token that gave one robot a container), a screen's report by screen, an
order id taken on a screen's day by both. Every function here takes the state and ``now_ms`` and returns the
new state and the messages to send; none touches Kafka or a clock, and each is idempotent under redelivery: a
message seen before changes nothing and sends nothing it did not send the first time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tables.shop_cards import CardRef, card_ref

__all__ = [
    "SHOP_TOPICS",
    "SHOP_INPUTS",
    "SIZES",
    "ShopOrder",
    "parse_shop_order",
    "card_accepted",
    "decision_key",
    "CARD_INVALID",
    "CARD_DECLINED",
    "gateway_decision",
    "Capture",
    "Send",
    "OrderClaim",
    "claim_key",
    "order_sends",
    "line_outcome",
    "on_order",
    "Payment",
    "on_capture",
    "on_settle",
    "Stock",
    "on_reserve",
    "on_release",
    "on_deliver",
    "OpenedOrder",
    "DispatchOrder",
    "read_answer",
    "WaitEnd",
    "WAIT_COMPLETED",
    "WAIT_TIMEOUT",
    "WAIT_FAILED",
    "reservations",
    "settle",
    "dispatch_outcome",
    "ScreenReport",
    "on_outcome",
    "on_end",
    "LineRanges",
    "add_line",
    "has_line",
    "lines_counted",
]

#: Every topic of the shop (``shop.<name>``) and its key: orders/payments/dispatch/outcomes/transactions and the
#: payment's and the kitchen's answers by ticket, kitchen by flavour, screens/reports by screen. The dispatch flow
#: (app/shop_flows.py) reads dispatch and the two answer topics.
SHOP_TOPICS = (
    "orders",
    "payments",
    "kitchen",
    "dispatch",
    "payment-answers",
    "kitchen-answers",
    "outcomes",
    "screens",
    "reports",
    "transactions",
)
#: The topics a shop stage reads (the others are read by the screens and the audit).
SHOP_INPUTS = ("orders", "payments", "kitchen", "dispatch", "payment-answers", "kitchen-answers", "screens")

#: Scoops per size of an item.
SIZES: dict[str, int] = {"small": 1, "medium": 2, "large": 3}

READY = "ready"
ABORTED = "aborted"
INVALID = "invalid"
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Send:
    """A message to send: ``to`` names the topic (``shop.<to>``: "payments", "kitchen", "dispatch", "payment-answers",
    "kitchen-answers", "outcomes", "screens", "transactions")."""

    to: str
    key: str
    value: dict[str, Any]


# ------------------------------------------------------------------------------------------- orders


@dataclass(frozen=True)
class ShopOrder:
    """A valid order: its id, its card's reference, and the scoops per flavour it needs (items merged by flavour)."""

    order_id: str
    card: CardRef
    scoops: dict[str, int]
    amount_cents: int


#: The longest order id: ids are short names, and one bounded here keeps every message and state that holds it small.
MAX_ORDER_ID_CHARS = 200

#: The fields of an order's item (a field the shop does not know, say ``quantity``, is refused, never ignored).
ITEM_FIELDS = frozenset({"flavour", "size"})


def parse_shop_order(line: str, catalogue: Mapping[str, int], card_key: bytes = b"") -> tuple[ShopOrder | None, str | None]:
    """The order on a screen's line, or ``(None, reason)``.

    ``card`` is the :class:`CardRef` the screen put there; a line written by something else may hold the number
    itself, which becomes its reference here (``card_key``), and goes no further.
    """
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError) as error:  # RecursionError: nested too deep for the decoder
        return None, f"broken line: {type(error).__name__}: {str(error)[:200]}"
    if not isinstance(raw, dict):
        return None, f"an order must be a JSON object, got {type(raw).__name__}"
    order_id, card, items = raw.get("order_id"), raw.get("card"), raw.get("items")
    if not isinstance(order_id, str) or not order_id:
        return None, f"'order_id' must be a non-empty string, got {order_id!r:.60}"
    if len(order_id) > MAX_ORDER_ID_CHARS:
        return None, f"order id {order_id!r:.60} is {len(order_id)} characters long, at most {MAX_ORDER_ID_CHARS} are allowed"
    if isinstance(card, str) and card:
        reference = card_ref(card, card_key)
    elif isinstance(card, dict):
        try:
            reference = CardRef.from_dict(card)
        except ValueError as error:
            return None, f"order {order_id!r}: 'card': {error}"
    else:
        return None, f"order {order_id!r}: 'card' must be a non-empty string or a card reference (token, last4, luhn_ok)"
    if not isinstance(items, list) or not items:
        return None, f"order {order_id!r}: 'items' must be a non-empty list"
    scoops: dict[str, int] = {}
    amount = 0
    for number, item in enumerate(items):
        if not isinstance(item, dict):
            return None, f"order {order_id!r} item {number}: an item must be a JSON object, got {type(item).__name__}"
        unknown = sorted(str(field) for field in item if field not in ITEM_FIELDS)
        if unknown:
            return None, f"order {order_id!r} item {number}: unknown field(s) {unknown!r:.80}, an item has only {sorted(ITEM_FIELDS)}"
        flavour = item.get("flavour")
        size = item.get("size")
        if not isinstance(flavour, str) or flavour not in catalogue:
            return None, f"order {order_id!r} item {number}: unknown flavour {flavour!r:.60}, expected one of {sorted(catalogue)}"
        if not isinstance(size, str) or size not in SIZES:
            return None, f"order {order_id!r} item {number}: unknown size {size!r:.60}, expected one of {sorted(SIZES)}"
        scoops[str(flavour)] = scoops.get(str(flavour), 0) + SIZES[str(size)]
        amount += catalogue[str(flavour)] * SIZES[str(size)]
    return ShopOrder(order_id, reference, scoops, amount), None


def card_accepted(seed: int, order_id: str, reject_rate: float) -> bool:
    """The gateway's draw for an order's card: random-looking, but a function of the seed and the order."""
    digest = hashlib.sha256(f"{seed}:{order_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 >= reject_rate


def decision_key(screen: str, line: int, order_id: str) -> str:
    """What the gateway's draw is keyed by: the screen's name (not its day), the line and the order id, so that the
    same files give the same fates on any day and a replayed capture draws the same."""
    return f"{screen.rsplit('/', 1)[-1]}/{line}/{order_id}"


#: Reasons of a rejected card (each starts "card rejected", the class the reports count it under).
CARD_INVALID = "card rejected: invalid number (Luhn check failed)"
CARD_DECLINED = "card rejected: declined"


def gateway_decision(card: CardRef, key: str, seed: int, reject_rate: float) -> str | None:
    """The gateway's decision on a capture: ``None`` (accepted) or why the card is rejected."""
    if not card.luhn_ok:
        return CARD_INVALID
    return None if card_accepted(seed, key, reject_rate) else CARD_DECLINED


def line_outcome(ticket: str, screen: str, line: int, order_id: str | None, status: str, reason: str) -> list[Send]:
    """A line that sets no order going (invalid, duplicate): its outcome, to the screen and to the screen's report."""
    outcome = {
        "ticket": ticket,
        "screen": screen,
        "line": line,
        "order_id": order_id,
        "status": status,
        "reason": reason,
        "amount_cents": 0,
    }
    return [Send("outcomes", ticket, outcome), Send("screens", screen, {"kind": "outcome", **outcome})]


def order_sends(order: ShopOrder, ticket: str, screen: str, line: int, deadline_ms: int) -> list[Send]:
    """What a line's order sets going, both keyed by its ticket: the open at the dispatch barrier and the payment's
    capture. The reservations wait for the capture (:func:`reservations`), as in the seed's two-phase commit.
    ``deadline_ms``: by when the orders stage expects the order resolved (the dispatch barriers' timeouts count from
    each barrier's arrival)."""
    opened = {
        "kind": "open",
        "order_id": ticket,
        "ticket": ticket,
        "screen": screen,
        "line": line,
        "order": {"order_id": order.order_id, "scoops": order.scoops, "amount_cents": order.amount_cents},
        "deadline_ms": deadline_ms,
    }
    capture = Capture(ticket, order.amount_cents, decision_key(screen, line, order.order_id), order.card)
    return [Send("dispatch", ticket, opened), Send("payments", ticket, capture.to_message())]


# ------------------------------------------------------------------------------------ order ids


@dataclass(frozen=True)
class OrderClaim:
    """An order id taken on a screen's day (table ``shop_order_ids``, keyed by :func:`claim_key`): the line that took it."""

    screen: str
    order_id: str
    ticket: str
    line: int

    def to_dict(self) -> dict[str, Any]:
        return {"screen": self.screen, "order_id": self.order_id, "ticket": self.ticket, "line": self.line}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OrderClaim:
        return cls(str(raw["screen"]), str(raw["order_id"]), str(raw["ticket"]), int(raw["line"]))


def claim_key(screen: str, order_id: str) -> str:
    """The key of an order id on a screen's day: both, as a JSON pair (no separator a name could hold)."""
    return json.dumps([screen, order_id], ensure_ascii=False, separators=(",", ":"))


def on_order(
    previous: OrderClaim | None, screen: str, ticket: str, line: int, order_id: str, forward: list[Send]
) -> tuple[OrderClaim, list[Send], str | None]:
    """A line's order asks for its id on the screen's day; returns the claim, what to send and why it is refused.

    The first line to ask takes the id, and its order goes on (``forward``: the capture and the open). Another
    line with that id is a duplicate: it is answered (status ``duplicate``, nothing charged, nothing reserved)
    and refused. The same line asking again (its orders stage ran twice under at_least_once) gets ``forward``
    again: each of those messages is idempotent where it lands.
    """
    if previous is None:
        return OrderClaim(screen, order_id, ticket, line), list(forward), None
    if previous.ticket == ticket:
        return previous, list(forward), None
    reason = f"duplicate order: order id {order_id!r} was taken by line {previous.line} of this screen"
    return previous, line_outcome(ticket, screen, line, order_id, DUPLICATE, reason), f"screen {screen} line {line}: {reason}"


# ----------------------------------------------------------------------------------------- payments

CAPTURED = "captured"
REJECTED = "rejected"
COMMITTED = "committed"
VOIDED = "voided"


@dataclass(frozen=True)
class Capture:
    """Phase one's request to the gateway (topic ``shop.payments``): the amount, the card's reference, and the key
    of the gateway's seeded draw (:func:`decision_key`)."""

    order_id: str
    amount_cents: int
    decision_key: str
    card: CardRef

    def to_message(self) -> dict[str, Any]:
        return {
            "kind": "capture",
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "decision_key": self.decision_key,
            "card": self.card.to_dict(),
        }

    @classmethod
    def from_message(cls, raw: Mapping[str, Any]) -> Capture:
        order_id, amount, key, card = (raw.get(name) for name in ("order_id", "amount_cents", "decision_key", "card"))
        if not isinstance(order_id, str) or not isinstance(amount, int) or isinstance(amount, bool) or not isinstance(key, str):
            raise ValueError("a capture needs 'order_id' (str), 'amount_cents' (int), 'decision_key' (str) and 'card' (object)")
        if not isinstance(card, dict):
            raise ValueError(f"a capture needs 'card' as an object (token, last4, luhn_ok), got {type(card).__name__}")
        return cls(order_id, amount, key, CardRef.from_dict(card))


@dataclass(frozen=True)
class Payment:
    """One order's payment in table ``shop_payments``: captured, then committed or voided (or rejected, and why).
    The card is its token and last four digits only."""

    order_id: str
    amount_cents: int
    state: str
    updated_ms: int
    card_token: str = ""
    card_last4: str = ""
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "state": self.state,
            "updated_ms": self.updated_ms,
            "card_token": self.card_token,
            "card_last4": self.card_last4,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Payment:
        return cls(
            str(raw["order_id"]),
            int(raw["amount_cents"]),
            str(raw["state"]),
            int(raw["updated_ms"]),
            str(raw.get("card_token") or ""),
            str(raw.get("card_last4") or ""),
            raw.get("reason"),
        )


def _transaction(payment: Payment, phase: str) -> Send:
    value = {
        "order_id": payment.order_id,
        "phase": phase,
        "amount_cents": payment.amount_cents,
        "card_token": payment.card_token,
        "card_last4": payment.card_last4,
        "reason": payment.reason,
        "at_ms": payment.updated_ms,
    }
    return Send("transactions", payment.order_id, value)


def _payment_answer(payment: Payment) -> Send:
    ok = payment.state != REJECTED
    return Send("payment-answers", payment.order_id, {"kind": "payment", "order_id": payment.order_id, "ok": ok, "reason": payment.reason})


def on_capture(previous: Payment | None, capture: Capture, seed: int, reject_rate: float, now_ms: int) -> tuple[Payment, list[Send]]:
    """Phase one: the gateway decides (:func:`gateway_decision`), then captures the amount or rejects the card.

    A capture seen again answers what was decided (the dispatch takes an answer once), and logs nothing new.
    """
    if previous is not None:
        return previous, [_payment_answer(previous)] if previous.state in (CAPTURED, REJECTED) else []
    reason = gateway_decision(capture.card, capture.decision_key, seed, reject_rate)
    state = CAPTURED if reason is None else REJECTED
    card = capture.card
    payment = Payment(capture.order_id, capture.amount_cents, state, now_ms, card.token, card.last4, reason)
    return payment, [_transaction(payment, payment.state), _payment_answer(payment)]


def on_settle(previous: Payment | None, order_id: str, commit: bool, now_ms: int) -> tuple[Payment | None, list[Send], str | None]:
    """Phase two: commit (delivered) or void (aborted) a capture; an error when it cannot be settled that way."""
    if previous is None:
        return None, [], f"payments: order {order_id!r} has no capture to {'commit' if commit else 'void'}"
    target = COMMITTED if commit else VOIDED
    if previous.state == target or (previous.state == REJECTED and not commit):
        return previous, [], None  # settled before (or nothing was captured)
    if previous.state != CAPTURED:
        return previous, [], f"payments: order {order_id!r} is {previous.state}, it cannot become {target}"
    settled = replace(previous, state=target, updated_ms=now_ms)
    return settled, [_transaction(settled, target)], None


# -------------------------------------------------------------------------------------------- stock


@dataclass(frozen=True)
class Stock:
    """One flavour's container in table ``shop_stock``, owned by one kitchen worker at a time."""

    flavour: str
    available: int
    #: order id -> scoops reserved for it
    reserved: dict[str, int] = field(default_factory=dict)
    #: orders whose reservation failed (a redelivered reservation fails again)
    refused: frozenset[str] = frozenset()
    delivered: int = 0
    initial: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "flavour": self.flavour,
            "available": self.available,
            "reserved": dict(self.reserved),
            "refused": sorted(self.refused),
            "delivered": self.delivered,
            "initial": self.initial,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Stock:
        return cls(
            flavour=str(raw["flavour"]),
            available=int(raw["available"]),
            reserved={str(order): int(scoops) for order, scoops in (raw.get("reserved") or {}).items()},
            refused=frozenset(raw.get("refused") or ()),
            delivered=int(raw.get("delivered") or 0),
            initial=int(raw.get("initial") or 0),
        )


def on_reserve(stock: Stock, order_id: str, scoops: int, *, settled: bool = False) -> tuple[Stock, list[Send]]:
    """Reserve ``scoops`` for an order, or refuse for lack of stock; never below zero.

    ``settled``: this flavour was delivered or released for the order already (the kitchen remembers it
    for the done retention after a release or a delivery). A reservation after that is one sent again (the
    orders stage replayed under at_least_once) or one that lost the race with a timeout's release: it
    reserves nothing and answers nothing, as the order has its outcome.
    """
    if settled:
        return stock, []
    if order_id in stock.reserved or order_id in stock.refused:
        ok = order_id in stock.reserved
        return stock, [Send("kitchen-answers", order_id, _kitchen_answer(stock.flavour, order_id, ok))]
    if scoops <= stock.available:
        updated = replace(stock, available=stock.available - scoops, reserved={**stock.reserved, order_id: scoops})
        return updated, [Send("kitchen-answers", order_id, _kitchen_answer(stock.flavour, order_id, True))]
    refused = replace(stock, refused=stock.refused | {order_id})
    return refused, [Send("kitchen-answers", order_id, _kitchen_answer(stock.flavour, order_id, False))]


def _kitchen_answer(flavour: str, order_id: str, ok: bool) -> dict[str, Any]:
    return {"kind": "kitchen", "order_id": order_id, "flavour": flavour, "ok": ok, "reason": None if ok else f"out of stock: {flavour}"}


def on_release(stock: Stock, order_id: str) -> Stock:
    """The order aborted: its reserved scoops go back into the container (and its refusal is forgotten)."""
    scoops = stock.reserved.get(order_id)
    reserved = {order: count for order, count in stock.reserved.items() if order != order_id}
    available = stock.available + (scoops or 0)
    return replace(stock, available=available, reserved=reserved, refused=stock.refused - {order_id})


def on_deliver(stock: Stock, order_id: str) -> Stock:
    """The order was delivered: its reserved scoops leave the shop."""
    scoops = stock.reserved.get(order_id)
    if scoops is None:
        return stock  # delivered before
    reserved = {order: count for order, count in stock.reserved.items() if order != order_id}
    return replace(stock, reserved=reserved, delivered=stock.delivered + scoops)


# ----------------------------------------------------------------------------------------- dispatch
#
# Dispatch is a flow (app/shop_flows.py) with two barriers, in the seed's sequence: the order's open waits for the
# gateway's answer to the capture; captured, the flow asks the kitchen (one reservation per flavour) and waits for
# every answer; then it settles. The functions below are its steps' pure parts: what to reserve after the payment's
# wait, what to send once both waits ended. The barriers (tables/barrier.py) hold the waiting and the answers.

#: How a dispatch barrier's wait ended (the barrier's report, ``tables.barrier.release_report``).
WAIT_COMPLETED = "completed"
WAIT_TIMEOUT = "timeout"
WAIT_FAILED = "failed"


@dataclass(frozen=True)
class OpenedOrder:
    """What the dispatch's ``open`` says of an order: no card, only what the kitchen and the report need."""

    order_id: str
    scoops: dict[str, int]
    amount_cents: int


@dataclass(frozen=True)
class DispatchOrder:
    """An order at dispatch, from its open (keyed, paid and reserved by its ticket, not by the customer's order id)."""

    ticket: str
    screen: str
    line: int
    order: OpenedOrder

    @classmethod
    def from_open(cls, raw: Any) -> DispatchOrder:
        """The order of an ``open`` (:func:`order_sends`), or ValueError naming what is wrong."""
        try:
            ticket, screen, line, order = raw["ticket"], raw["screen"], raw["line"], raw["order"]
            scoops = dict(order["scoops"].items())
            amount = order["amount_cents"]
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            message = f"shop dispatch: an open needs 'ticket', 'screen', 'line' and 'order' (scoops, amount_cents): {error!r}"
            raise ValueError(message) from None
        if not isinstance(ticket, str) or not isinstance(screen, str) or not isinstance(line, int) or not isinstance(amount, int):
            raise ValueError("shop dispatch: an open needs 'ticket' (str), 'screen' (str), 'line' (int), 'order.amount_cents' (int)")
        if not scoops or not all(isinstance(count, int) and not isinstance(count, bool) and count > 0 for count in scoops.values()):
            raise ValueError(f"shop dispatch: open of {ticket!r}: 'order.scoops' must map flavours to positive integers")
        return cls(ticket, screen, line, OpenedOrder(ticket, scoops, amount))


def read_answer(raw: Any, *, kitchen: bool) -> dict[str, Any]:
    """A payment's or a kitchen's answer as dispatch reads it, or ValueError naming what is wrong."""
    what = "kitchen" if kitchen else "payment"
    if not isinstance(raw, dict) or not isinstance(raw.get("order_id"), str) or not isinstance(raw.get("ok"), bool):
        raise ValueError(f"shop dispatch: a {what} answer needs a string 'order_id' and a boolean 'ok'")
    if kitchen and not isinstance(raw.get("flavour"), str):
        raise ValueError(f"shop dispatch: kitchen answer of {raw['order_id']!r} needs a string 'flavour'")
    reason = raw.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"shop dispatch: {what} answer of {raw['order_id']!r}: 'reason' must be a string or null")
    return raw


@dataclass(frozen=True)
class WaitEnd:
    """How one of dispatch's waits ended (``status``: completed, timeout or failed, and why) and the answers it got."""

    status: str
    answers: tuple[dict[str, Any], ...] = ()
    error: str | None = None


def reservations(order: DispatchOrder, payment: WaitEnd) -> list[Send]:
    """Phase one's second half, after the payment's wait: a captured order's reservations, one per flavour, keyed by
    flavour. A rejected card (or no answer) reserves nothing: the kitchen never hears of the order."""
    captured = payment.status == WAIT_COMPLETED and bool(payment.answers) and payment.answers[0].get("ok") is True
    if not captured:
        return []
    return [
        Send("kitchen", flavour, {"kind": "reserve", "order_id": order.ticket, "flavour": flavour, "scoops": scoops})
        for flavour, scoops in sorted(order.order.scoops.items())
    ]


def dispatch_outcome(order: DispatchOrder, status: str, reason: str | None) -> list[Send]:
    """The order's one outcome, to the screen and to the screen's report."""
    outcome = {
        "ticket": order.ticket,
        "screen": order.screen,
        "line": order.line,
        "order_id": order.ticket,
        "status": status,
        "reason": reason,
        "amount_cents": order.order.amount_cents if status == READY else 0,
    }
    return [Send("outcomes", order.ticket, outcome), Send("screens", order.screen, {"kind": "outcome", **outcome})]


def settle(order: DispatchOrder, payment: WaitEnd, kitchen: WaitEnd) -> list[Send]:
    """Phase two, once both waits ended: every flavour reserved and the capture made, commit and deliver (``ready``);
    otherwise void the capture and release every flavour asked for (``aborted``, and why).

    A capture whose answer did not come in time is voided all the same: the void follows the capture in the
    payments partition (both keyed by ticket), so a capture that lands late is voided, never left open. A release
    follows its reservation in the flavour's partition the same way.
    """
    ticket = order.ticket
    flavours = sorted(order.order.scoops)
    void = Send("payments", ticket, {"kind": "void", "order_id": ticket})
    answer = payment.answers[0] if payment.answers else None
    if answer is None:
        reason = "timeout waiting for payment" if payment.status == WAIT_TIMEOUT else f"payment failed: {payment.error}"
        return [void, *dispatch_outcome(order, ABORTED, reason)]
    if answer.get("ok") is not True:
        return dispatch_outcome(order, ABORTED, answer.get("reason") or "card rejected")
    refused = sorted({str(item["flavour"]) for item in kitchen.answers if item.get("ok") is not True})
    answered = {str(item["flavour"]) for item in kitchen.answers}
    if kitchen.status == WAIT_COMPLETED and not refused and answered >= set(flavours):
        sends = [Send("payments", ticket, {"kind": "commit", "order_id": ticket})]
        sends += [Send("kitchen", flavour, {"kind": "deliver", "order_id": ticket, "flavour": flavour}) for flavour in flavours]
        return sends + dispatch_outcome(order, READY, None)
    if refused:
        reason = "; ".join(f"out of stock: {flavour}" for flavour in refused)
    elif kitchen.status == WAIT_TIMEOUT:
        reason = "timeout waiting for kitchen"
    else:
        reason = f"kitchen failed: {kitchen.error}"
    # Every flavour gets a release, answered or not: a reservation still on its way is released when it lands.
    releases = [Send("kitchen", flavour, {"kind": "release", "order_id": ticket, "flavour": flavour}) for flavour in flavours]
    return [void, *releases, *dispatch_outcome(order, ABORTED, reason)]


# ------------------------------------------------------------------------------------------ reports


@dataclass(frozen=True)
class ScreenReport:
    """A screen's day in table ``shop_reports``: outcomes counted once per line, until its end says how many."""

    screen: str
    #: the lines counted so far, as sorted half-open ranges ``(first, end)``: a screen's lines come in order,
    #: so this stays one range or a few, and a write's size does not grow with the day
    lines_seen: tuple[tuple[int, int], ...] = ()
    served: int = 0
    revenue_cents: int = 0
    aborted: dict[str, int] = field(default_factory=dict)
    invalid: int = 0
    expected_lines: int | None = None
    flushed: bool = False
    #: lines refused because their order id was taken by an earlier line of the screen's day
    duplicate: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "screen": self.screen,
            "lines_seen": [list(span) for span in self.lines_seen],
            "served": self.served,
            "revenue_cents": self.revenue_cents,
            "aborted": dict(self.aborted),
            "invalid": self.invalid,
            "duplicate": self.duplicate,
            "expected_lines": self.expected_lines,
            "flushed": self.flushed,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ScreenReport:
        return cls(
            screen=str(raw["screen"]),
            lines_seen=_line_ranges(raw.get("lines_seen") or ()),
            served=int(raw.get("served") or 0),
            revenue_cents=int(raw.get("revenue_cents") or 0),
            aborted={str(reason): int(count) for reason, count in (raw.get("aborted") or {}).items()},
            invalid=int(raw.get("invalid") or 0),
            expected_lines=raw.get("expected_lines"),
            flushed=bool(raw.get("flushed")),
            duplicate=int(raw.get("duplicate") or 0),
        )


LineRanges = tuple[tuple[int, int], ...]


def has_line(ranges: LineRanges, line: int) -> bool:
    return any(first <= line < end for first, end in ranges)


def lines_counted(ranges: LineRanges) -> int:
    return sum(end - first for first, end in ranges)


def add_line(ranges: LineRanges, line: int) -> LineRanges:
    """``ranges`` with ``line`` in it, merged with its neighbours (sorted, no overlaps, no touching ranges)."""
    spans = sorted([*ranges, (line, line + 1)])
    merged: list[tuple[int, int]] = []
    for first, end in spans:
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((first, end))
    return tuple(merged)


def _line_ranges(raw: Any) -> LineRanges:
    """Ranges as stored (``[[first, end], ...]``), or the older list of line numbers."""
    ranges: LineRanges = ()
    for entry in raw:
        if isinstance(entry, list | tuple):
            for line in range(int(entry[0]), int(entry[1])):
                ranges = add_line(ranges, line) if not has_line(ranges, line) else ranges
        else:
            ranges = add_line(ranges, int(entry))
    return ranges


def _reason_class(reason: str | None) -> str:
    """Aborts grouped by kind: 'card rejected', 'out of stock', 'timeout'."""
    text = reason or "unknown"
    for kind in ("card rejected", "out of stock", "timeout"):
        if text.startswith(kind):
            return kind
    return text


def _maybe_report(state: ScreenReport) -> tuple[ScreenReport, list[Send]]:
    if state.flushed or state.expected_lines is None or lines_counted(state.lines_seen) < state.expected_lines:
        return state, []
    report = {
        "screen": state.screen,
        "lines": state.expected_lines,
        "served": state.served,
        "aborted": sum(state.aborted.values()),
        "aborted_by_reason": dict(sorted(state.aborted.items())),
        "invalid": state.invalid,
        "duplicate": state.duplicate,
        "revenue_cents": state.revenue_cents,
    }
    return replace(state, flushed=True), [Send("reports", state.screen, report)]


def on_outcome(
    previous: ScreenReport | None, screen: str, line: int, status: str, reason: str | None, amount_cents: int
) -> tuple[ScreenReport, list[Send]]:
    """One line's outcome, counted once (by line number)."""
    state = previous if previous is not None else ScreenReport(screen)
    if has_line(state.lines_seen, line) or state.flushed:
        return state, []
    state = replace(state, lines_seen=add_line(state.lines_seen, line))
    if status == READY:
        state = replace(state, served=state.served + 1, revenue_cents=state.revenue_cents + amount_cents)
    elif status == INVALID:
        state = replace(state, invalid=state.invalid + 1)
    elif status == DUPLICATE:
        state = replace(state, duplicate=state.duplicate + 1)
    else:
        kind = _reason_class(reason)
        state = replace(state, aborted={**state.aborted, kind: state.aborted.get(kind, 0) + 1})
    return _maybe_report(state)


def on_end(previous: ScreenReport | None, screen: str, lines: int) -> tuple[ScreenReport, list[Send]]:
    """The screen's end of day: how many lines its file had (each has exactly one outcome)."""
    state = previous if previous is not None else ScreenReport(screen)
    if state.expected_lines is not None:
        return state, []
    return _maybe_report(replace(state, expected_lines=lines))
