"""The ice-cream shop's state: typed values of its tables and their pure cores (orders, payments, stock, dispatch, end of day).

The seed's shop (screens, a Bully-elected leader, robots passing flavour tokens, a payment gateway with
two-phase commit) rebuilt as streams. A card number never reaches this module's messages: a line's card is a
:class:`~shop.cards.CardRef` (token, last four digits, Luhn fact) from the screen that read it. Every
message is keyed so that one partition owns each piece of state: an order's payment and dispatch by order id,
a flavour's stock by flavour (the token that gave one robot a container), the order ids taken on a screen's day
by screen and shard. A screen's end of day runs on the end-of-stream pattern (seed 000): each line's outcome is
a batch forwarded to the group-by/aggregate stage and reported to the controller (:func:`outcome_sends`), the
day's totals and report are this module's :func:`day_merge` and :func:`day_report`.

Every function here takes the state and ``now_ms`` and returns the new state and the messages to send; none
touches Kafka or a clock, and each is idempotent under redelivery: a message seen before changes nothing and
sends nothing it did not send the first time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shop.cards import CardRef, card_ref

__all__ = [
    "SHOP_TOPICS",
    "SHOP_INPUTS",
    "DAY_AGGREGATE",
    "DAY_COUNTER",
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
    "CLAIM_SHARDS",
    "ClaimShard",
    "claim_key",
    "claim_shard_keys",
    "order_sends",
    "line_outcome",
    "outcome_sends",
    "on_order",
    "on_claims_cleanup",
    "claims_tombstone_due",
    "Payment",
    "on_capture",
    "on_settle",
    "FINAL_PAYMENT_STATES",
    "past_done_retention",
    "done_due",
    "late_capture",
    "payment_due",
    "payment_deadlines",
    "on_payment_deadline",
    "Stock",
    "on_reserve",
    "late_reservation",
    "on_release",
    "on_deliver",
    "kitchen_mark",
    "read_deadline",
    "OpenedOrder",
    "DispatchOrder",
    "is_positive_count",
    "read_answer",
    "WaitEnd",
    "WAIT_COMPLETED",
    "WAIT_TIMEOUT",
    "WAIT_FAILED",
    "reservations",
    "settle",
    "dispatch_outcome",
    "read_outcome",
    "day_zero",
    "day_merge",
    "day_report",
]

#: Every topic of the shop (``shop.<name>``) and its key: orders/payments/dispatch/outcomes/transactions and the
#: payment's and the kitchen's answers by ticket, kitchen by flavour, claims by screen and shard. The dispatch flow
#: (shop/flows.py) reads dispatch and the two answer topics. The end of day runs on the end-of-stream topics
#: (``eof-counter``, ``eof-aggregate``, ``eof-join``, ``eof-reports``, keyed by screen).
SHOP_TOPICS = (
    "orders",
    "payments",
    "kitchen",
    "dispatch",
    "payment-answers",
    "kitchen-answers",
    "outcomes",
    "claims",
    "transactions",
)
#: The topics a shop stage reads (the others are read by the screens and the audit).
SHOP_INPUTS = ("orders", "payments", "kitchen", "dispatch", "payment-answers", "kitchen-answers", "claims")
#: Where a line's outcome goes for the end of day: the end-of-stream pattern's group-by/aggregate and controller topics.
DAY_AGGREGATE = "eof-aggregate"
DAY_COUNTER = "eof-counter"

#: Scoops per size of an item.
SIZES: dict[str, int] = {"small": 1, "medium": 2, "large": 3}

READY = "ready"
ABORTED = "aborted"
INVALID = "invalid"
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Send:
    """A message to send: ``to`` names the topic (``shop.<to>``: "payments", "kitchen", "dispatch", "payment-answers",
    "kitchen-answers", "outcomes", "claims", "transactions"; or the end of day's "eof-aggregate", "eof-counter")."""

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
    """A line that sets no order going (invalid, duplicate): its outcome, to the screen and to the screen's day."""
    outcome = {
        "ticket": ticket,
        "screen": screen,
        "line": line,
        "order_id": order_id,
        "status": status,
        "reason": reason,
        "amount_cents": 0,
    }
    return outcome_sends(outcome)


def outcome_sends(outcome: dict[str, Any]) -> list[Send]:
    """A line's one outcome: to the screen (``outcomes``, by ticket), and to the screen's end of day as seed 000's
    filter stage does it, in one transaction: the outcome forwarded as batch ``<line - 1>.0`` to the
    group-by/aggregate stage, and the report "batch <line - 1>: forwarded 1" to the controller. The screen says it
    sent as many batches as it had lines; each line has exactly one outcome, so the count is final once every
    line's report is in. Sent again (a redelivery), both are counted once, by batch id."""
    screen, batch = outcome["screen"], int(outcome["line"]) - 1
    forwarded = {"kind": "batch", "client": screen, "batch_id": f"{batch}.0", "records": [outcome]}
    report = {"kind": "filtered", "client": screen, "batch_id": batch, "forwarded": 1, "dropped": 0}
    return [Send("outcomes", str(outcome["ticket"]), outcome), Send(DAY_AGGREGATE, screen, forwarded), Send(DAY_COUNTER, screen, report)]


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
    capture = Capture(ticket, order.amount_cents, decision_key(screen, line, order.order_id), order.card, deadline_ms)
    return [Send("dispatch", ticket, opened), Send("payments", ticket, capture.to_message())]


# ------------------------------------------------------------------------------------ order ids


#: The shards of a screen's day's order ids: a shard's value grows with the ids it holds, the day's cleanup sends
#: one message per shard.
CLAIM_SHARDS = 32


@dataclass(frozen=True)
class ClaimShard:
    """The order ids taken on a screen's day, one shard of them (table ``shop_order_ids``, keyed by :func:`claim_key`):
    each id with the ticket and line that took it. Once the day is cleaned up, a tombstone (``closed_ms``, no ids)
    that answers a late claim until it goes."""

    screen: str
    shard: int
    taken: dict[str, tuple[str, int]] = field(default_factory=dict)
    closed_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        taken = {order_id: list(by) for order_id, by in self.taken.items()}
        return {"screen": self.screen, "shard": self.shard, "taken": taken, "closed_ms": self.closed_ms}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClaimShard:
        taken = {str(order_id): (str(ticket), int(line)) for order_id, (ticket, line) in (raw.get("taken") or {}).items()}
        closed = raw.get("closed_ms")
        return cls(str(raw["screen"]), int(raw["shard"]), taken, None if closed is None else int(closed))


def _shard_key(screen: str, shard: int) -> str:
    return json.dumps([screen, shard], ensure_ascii=False, separators=(",", ":"))


def claim_key(screen: str, order_id: str) -> str:
    """The key of the shard that holds ``order_id`` on a screen's day: the screen and the shard, as a JSON pair."""
    digest = hashlib.sha256(order_id.encode("utf-8", "surrogatepass")).digest()
    return _shard_key(screen, int.from_bytes(digest[:4], "big") % CLAIM_SHARDS)


def claim_shard_keys(screen: str) -> list[str]:
    """Every shard key of a screen's day: where its end-of-day cleanup goes."""
    return [_shard_key(screen, shard) for shard in range(CLAIM_SHARDS)]


def on_order(
    previous: ClaimShard | None, screen: str, ticket: str, line: int, order_id: str, forward: list[Send]
) -> tuple[ClaimShard, list[Send], str | None]:
    """A line's order asks for its id on the screen's day; returns the shard, what to send and why it is refused.

    The first line to ask takes the id, and its order goes on (``forward``: the capture and the open). Another
    line with that id is a duplicate: it is answered (status ``duplicate``, nothing charged, nothing reserved)
    and refused. The same line asking again (its orders stage ran twice under at_least_once) gets ``forward``
    again: each of those messages is idempotent where it lands.
    """
    shard = previous if previous is not None else ClaimShard(screen, json.loads(claim_key(screen, order_id))[1])
    if shard.closed_ms is not None:
        reason = "the screen's day is over: its report was delivered and its order ids dropped"
        return shard, line_outcome(ticket, screen, line, order_id, INVALID, reason), f"screen {screen} line {line}: {reason}"
    taken = shard.taken.get(order_id)
    if taken is None:
        return replace(shard, taken={**shard.taken, order_id: (ticket, line)}), list(forward), None
    if taken[0] == ticket:
        return shard, list(forward), None
    reason = f"duplicate order: order id {order_id!r} was taken by line {taken[1]} of this screen"
    return shard, line_outcome(ticket, screen, line, order_id, DUPLICATE, reason), f"screen {screen} line {line}: {reason}"


def on_claims_cleanup(previous: ClaimShard | None, key: str, now_ms: int) -> ClaimShard:
    """The screen's day is over (its report delivered): the shard's ids go; a tombstone stays, which answers a late
    claim ``invalid`` until :func:`claims_tombstone_due` (then the key is deleted)."""
    if previous is not None and previous.closed_ms is not None:
        return previous
    screen, shard = json.loads(key)
    return ClaimShard(str(screen), int(shard), {}, closed_ms=now_ms)


def claims_tombstone_due(state: ClaimShard, retention_ms: int) -> int | None:
    """When a shard's tombstone goes (None: an open shard, which the day's cleanup ends)."""
    return None if state.closed_ms is None else state.closed_ms + retention_ms


# ----------------------------------------------------------------------------------------- payments

CAPTURED = "captured"
REJECTED = "rejected"
COMMITTED = "committed"
VOIDED = "voided"
#: A payment's final states: nothing changes them (a capture, commit or void seen again is absorbed), and its key goes
#: once the done retention has passed (:func:`payment_due`). A payment still ``captured`` waits for its commit or void.
FINAL_PAYMENT_STATES = frozenset({COMMITTED, VOIDED, REJECTED})


def read_deadline(raw: Mapping[str, Any], what: str) -> int | None:
    """The order's deadline a message carries (``deadline_ms``, an integer in ms; None when it has none, as a message
    written before it travelled), or ValueError naming ``what`` (say "a capture") when it is something else."""
    deadline = raw.get("deadline_ms")
    if deadline is not None and (not isinstance(deadline, int) or isinstance(deadline, bool)):
        raise ValueError(f"{what}'s 'deadline_ms' must be an integer (ms) or absent, got {type(deadline).__name__}")
    return deadline


@dataclass(frozen=True)
class Capture:
    """Phase one's request to the gateway (topic ``shop.payments``): the amount, the card's reference, the key
    of the gateway's seeded draw (:func:`decision_key`), and the order's deadline (``deadline_ms``, the open's: a
    capture that finds no payment once that deadline and the done retention have passed is refused,
    :func:`late_capture`; None in a capture written before it was carried, which is never refused so)."""

    order_id: str
    amount_cents: int
    decision_key: str
    card: CardRef
    deadline_ms: int | None = None

    def to_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "kind": "capture",
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "decision_key": self.decision_key,
            "card": self.card.to_dict(),
        }
        if self.deadline_ms is not None:
            message["deadline_ms"] = self.deadline_ms
        return message

    @classmethod
    def from_message(cls, raw: Mapping[str, Any]) -> Capture:
        order_id, amount, key, card = (raw.get(name) for name in ("order_id", "amount_cents", "decision_key", "card"))
        if not isinstance(order_id, str) or not isinstance(amount, int) or isinstance(amount, bool) or not isinstance(key, str):
            raise ValueError("a capture needs 'order_id' (str), 'amount_cents' (int), 'decision_key' (str) and 'card' (object)")
        if not isinstance(card, dict):
            raise ValueError(f"a capture needs 'card' as an object (token, last4, luhn_ok), got {type(card).__name__}")
        return cls(order_id, amount, key, CardRef.from_dict(card), read_deadline(raw, "a capture"))


@dataclass(frozen=True)
class Payment:
    """One order's payment in table ``shop_payments``: captured, then committed or voided (or rejected, and why).
    The card is its token and last four digits only; ``deadline_ms`` is its capture's (the order's deadline, None
    if the capture carried none), which its key outlives (:func:`payment_due`)."""

    order_id: str
    amount_cents: int
    state: str
    updated_ms: int
    card_token: str = ""
    card_last4: str = ""
    reason: str | None = None
    deadline_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "order_id": self.order_id,
            "amount_cents": self.amount_cents,
            "state": self.state,
            "updated_ms": self.updated_ms,
            "card_token": self.card_token,
            "card_last4": self.card_last4,
            "reason": self.reason,
            "deadline_ms": self.deadline_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Payment:
        deadline = raw.get("deadline_ms")
        return cls(
            str(raw["order_id"]),
            int(raw["amount_cents"]),
            str(raw["state"]),
            int(raw["updated_ms"]),
            str(raw.get("card_token") or ""),
            str(raw.get("card_last4") or ""),
            raw.get("reason"),
            None if deadline is None else int(deadline),
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
    payment = Payment(capture.order_id, capture.amount_cents, state, now_ms, card.token, card.last4, reason, capture.deadline_ms)
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


def past_done_retention(deadline_ms: int, now_ms: int, retention_ms: int) -> bool:
    """Whether a message for an order comes once the order's deadline and the done retention (``WEIR_DONE_RETENTION_MS``)
    have passed. What a stage keeps of a settled order outlives that instant (:func:`done_due`), so such a message
    that finds nothing kept of its order is one the stage may have seen and forgotten: the rule of a late capture
    (:func:`late_capture`) and of a late reservation (:func:`late_reservation`)."""
    return now_ms >= deadline_ms + retention_ms


def done_due(final_ms: int, deadline_ms: int | None, retention_ms: int) -> int:
    """When what a stage keeps of a settled order goes: the done retention after it was settled (``final_ms``) and
    after the order's deadline, whichever is later (after ``final_ms`` only when the order's deadline is not known).
    Kept so, it is there for any message of the order that is not yet :func:`past_done_retention`."""
    return (final_ms if deadline_ms is None else max(final_ms, deadline_ms)) + retention_ms


def late_capture(previous: Payment | None, capture: Capture, now_ms: int, retention_ms: int) -> str | None:
    """Why a capture is refused as late (None: it is not). A capture that finds no payment for its ticket once its
    order's deadline and the done retention have passed captures nothing and answers nothing: the order has had its
    outcome (the dispatch aborts an order whose capture is not answered by then), and the payment it would repeat may
    have been settled and expired (:func:`payment_due`: a payment's key outlives its capture's deadline by the
    retention, so the same capture delivered again after its key went is always this late). Capturing it again
    would charge the card a second time, with nothing left to settle it."""
    if previous is not None or capture.deadline_ms is None or not past_done_retention(capture.deadline_ms, now_ms, retention_ms):
        return None
    return (
        f"payments: capture of {capture.order_id!r} came {now_ms - capture.deadline_ms} ms after its order's deadline, "
        f"past the done retention ({retention_ms} ms), and finds no payment: nothing is captured or answered"
    )


def payment_due(payment: Payment, retention_ms: int) -> int | None:
    """When a payment's key goes: a final payment (committed, voided or rejected) once the done retention has passed
    since it became final and since its capture's deadline, whichever is later; None for a payment still ``captured``,
    which never expires (its commit or void is still to come)."""
    if payment.state not in FINAL_PAYMENT_STATES:
        return None
    return done_due(payment.updated_ms, payment.deadline_ms, retention_ms)


def payment_deadlines(previous: Payment | None, payment: Payment | None, retention_ms: int) -> tuple[int, ...]:
    """The deadline a change to a payment files: its :func:`payment_due` when this change made it final (a commit or
    void of a capture, a rejected card); nothing for a capture still open or a phase seen again."""
    if payment is None or (previous is not None and previous.state == payment.state):
        return ()
    due = payment_due(payment, retention_ms)
    return () if due is None else (due,)


def on_payment_deadline(payment: Payment, now_ms: int, retention_ms: int) -> Payment | None:
    """A payment's deadline came: None (its key is deleted) once it is due (:func:`payment_due`), else the payment."""
    due = payment_due(payment, retention_ms)
    return None if due is not None and now_ms >= due else payment


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
    for the done retention after a release or a delivery, :func:`kitchen_mark`). A reservation after that is one
    sent again (the dispatch replayed under at_least_once) or one that lost the race with a timeout's release: it
    reserves nothing and answers nothing, as the order has its outcome. One that comes after the mark went is
    refused before it gets here (:func:`late_reservation`).
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


def late_reservation(stock: Stock, order_id: str, deadline_ms: int | None, now_ms: int, retention_ms: int, *, settled: bool) -> str | None:
    """Why a reservation is refused as late (None: it is not). A reservation that finds neither its order's settled
    mark (``settled``) nor anything of the order in the container (scoops reserved, or a refusal) once its order's
    deadline and the done retention have passed reserves nothing and answers nothing: the order has had its outcome
    (the dispatch aborts an order whose reservations are not answered by then), and the mark that would have
    absorbed it may have expired (:func:`kitchen_mark`: a mark outlives its order's deadline by the retention, so
    the same reservation delivered again after its mark went is always this late). Reserving it again would hold
    scoops that no release or delivery will ever come for. A reservation that finds the order in the container is
    answered again as ever (its scoops' release or delivery is still to come); one without a deadline, written before
    reservations carried one, is taken as a first reservation."""
    if settled or deadline_ms is None or order_id in stock.reserved or order_id in stock.refused:
        return None
    if not past_done_retention(deadline_ms, now_ms, retention_ms):
        return None
    return (
        f"kitchen: reservation of {order_id!r} ({stock.flavour}) came {now_ms - deadline_ms} ms after its order's "
        f"deadline, past the done retention ({retention_ms} ms), and finds no settled mark and no reservation of the "
        f"order: nothing is reserved or answered"
    )


def kitchen_mark(now_ms: int, deadline_ms: int | None) -> int:
    """The value of an order's settled mark for a flavour (table ``shop_kitchen_settled``, key ``flavour/ticket``),
    filed at its first release or delivery: the instant its done retention counts from, that release or delivery
    or the order's deadline if later (the release or delivery carries the deadline; without one, as in a message
    written before it travelled, the release or delivery). The mark goes once the retention has passed since then
    (:func:`done_due`), so it is there for any reservation of the order not yet :func:`past_done_retention`, and a
    mark written before the deadline was carried (its value: when it was written) is read the same way."""
    return now_ms if deadline_ms is None else max(now_ms, deadline_ms)


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
# Dispatch is a flow (shop/flows.py) with two barriers, in the seed's sequence: the order's open waits for the
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


def is_positive_count(value: Any) -> bool:
    """An integer above 0 (not a bool): a count of scoops, a line number."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class DispatchOrder:
    """An order at dispatch, from its open (keyed, paid and reserved by its ticket, not by the customer's order id)."""

    ticket: str
    screen: str
    line: int
    order: OpenedOrder
    #: the order's deadline (the open's ``deadline_ms``; None in an open written before it was carried): every
    #: message to the kitchen carries it (:func:`late_reservation`, :func:`kitchen_mark`)
    deadline_ms: int | None = None

    def kitchen(self, kind: str, flavour: str, **fields: Any) -> Send:
        """A reservation, release or delivery of one flavour of this order, keyed by flavour, with its deadline."""
        message: dict[str, Any] = {"kind": kind, "order_id": self.ticket, "flavour": flavour, **fields}
        if self.deadline_ms is not None:
            message["deadline_ms"] = self.deadline_ms
        return Send("kitchen", flavour, message)

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
        if not scoops or not all(map(is_positive_count, scoops.values())):
            raise ValueError(f"shop dispatch: open of {ticket!r}: 'order.scoops' must map flavours to positive integers")
        deadline = read_deadline(raw, f"shop dispatch: open of {ticket!r}: an open")
        return cls(ticket, screen, line, OpenedOrder(ticket, scoops, amount), deadline)


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
    flavour, each with the order's deadline (:func:`late_reservation`). A rejected card (or no answer) reserves
    nothing: the kitchen never hears of the order."""
    captured = payment.status == WAIT_COMPLETED and bool(payment.answers) and payment.answers[0].get("ok") is True
    if not captured:
        return []
    return [order.kitchen("reserve", flavour, scoops=scoops) for flavour, scoops in sorted(order.order.scoops.items())]


def dispatch_outcome(order: DispatchOrder, status: str, reason: str | None) -> list[Send]:
    """The order's one outcome, to the screen and to the screen's day (:func:`outcome_sends`); a served order's
    scoops per flavour go with it, for the day's report."""
    outcome = {
        "ticket": order.ticket,
        "screen": order.screen,
        "line": order.line,
        "order_id": order.ticket,
        "status": status,
        "reason": reason,
        "amount_cents": order.order.amount_cents if status == READY else 0,
    }
    if status == READY:
        outcome["scoops"] = dict(sorted(order.order.scoops.items()))
    return outcome_sends(outcome)


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
        sends += [order.kitchen("deliver", flavour) for flavour in flavours]
        return sends + dispatch_outcome(order, READY, None)
    if refused:
        reason = "; ".join(f"out of stock: {flavour}" for flavour in refused)
    elif kitchen.status == WAIT_TIMEOUT:
        reason = "timeout waiting for kitchen"
    else:
        reason = f"kitchen failed: {kitchen.error}"
    # Every flavour gets a release, answered or not: a reservation still on its way is released when it lands.
    releases = [order.kitchen("release", flavour) for flavour in flavours]
    return [void, *releases, *dispatch_outcome(order, ABORTED, reason)]


# ------------------------------------------------------------------------------------------ end of day

# A screen's day is a client of the end-of-stream pattern (tables/eof.py): its lines are the batches the screen
# (the gateway) sent, each line's outcome the one batch forwarded for it (:func:`outcome_sends`). These are the
# day's job's steps (shop/day.py): the outcome kept, the day's totals, and the report.


def read_outcome(record: Any) -> dict[str, Any]:
    """A line's outcome as the day's totals need it; ``ValueError`` when it is not one."""
    if not isinstance(record, dict):
        raise ValueError(f"an outcome must be a JSON object, got {type(record).__name__}")
    status, reason, amount, scoops = (record.get(name) for name in ("status", "reason", "amount_cents", "scoops"))
    if status not in (READY, ABORTED, INVALID, DUPLICATE):
        raise ValueError(f"an outcome's 'status' must be ready, aborted, invalid or duplicate, got {status!r:.60}")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0 or not (reason is None or isinstance(reason, str)):
        raise ValueError("an outcome needs 'amount_cents' (a non-negative integer) and 'reason' (a string or null)")
    scoops = scoops or {}
    if not isinstance(scoops, dict) or not all(isinstance(f, str) and isinstance(n, int) and n > 0 for f, n in scoops.items()):
        raise ValueError("an outcome's 'scoops' must map flavours to positive integers")
    return {"status": status, "reason": reason, "amount_cents": amount, "scoops": scoops}


def _reason_class(reason: str | None) -> str:
    """Aborts grouped by kind: 'card rejected', 'out of stock', 'timeout'."""
    text = reason or "unknown"
    for kind in ("card rejected", "out of stock", "timeout"):
        if text.startswith(kind):
            return kind
    return text


def day_zero() -> dict[str, Any]:
    """The totals of a screen's day before its first outcome."""
    return {"lines": 0, "served": 0, "revenue_cents": 0, "aborted": {}, "invalid": 0, "duplicate": 0, "scoops": {}}


def day_merge(totals: dict[str, Any], outcome: Mapping[str, Any]) -> dict[str, Any]:
    """One line's outcome more (the aggregate stage merges each line once, by its batch id)."""
    totals["lines"] += 1
    status = outcome["status"]
    if status == READY:
        totals["served"] += 1
        totals["revenue_cents"] += outcome["amount_cents"]
        for flavour, count in outcome["scoops"].items():
            totals["scoops"][flavour] = totals["scoops"].get(flavour, 0) + count
    elif status == INVALID:
        totals["invalid"] += 1
    elif status == DUPLICATE:
        totals["duplicate"] += 1
    else:
        kind = _reason_class(outcome["reason"])
        totals["aborted"][kind] = totals["aborted"].get(kind, 0) + 1
    return totals


def day_report(screen: str, totals: Mapping[str, Any], prices: Mapping[str, int]) -> dict[str, Any]:
    """The screen's end-of-day report: its totals, and the scoops served per flavour joined with ``prices``."""
    flavours = {
        flavour: {"scoops": count, "revenue_cents": count * prices.get(flavour, 0)} for flavour, count in sorted(totals["scoops"].items())
    }
    return {
        "screen": screen,
        "lines": totals["lines"],
        "served": totals["served"],
        "aborted": sum(totals["aborted"].values()),
        "aborted_by_reason": dict(sorted(totals["aborted"].items())),
        "invalid": totals["invalid"],
        "duplicate": totals["duplicate"],
        "revenue_cents": totals["revenue_cents"],
        "flavours": flavours,
    }
