"""End-of-stream per client: the typed values of the controller and aggregator tables and their pure cores.

The protocol (seed 000). A gateway sends a client's price list to the joiner, numbers the client's batches
0..N-1 and sends them to the filter stage, then tells the controller "sent N". Filter workers run in
parallel; for every input batch they report to the controller how many batches they forwarded (0 when
they drop it, several when they split it), with deterministic ids ``<batch>.<k>``. The controller counts
reports *by batch id*, so a redelivered report is not counted twice. Once the reports cover batches
0..N-1 the number of batches reaching the group-by/aggregate stage is final: the controller sends it
"finish, expect M". The aggregator merges batches by id (scoops per flavour) and, holding M of them,
flushes the client's totals to the joiner; the joiner joins them with the client's price list and sends
the report to the gateway. When the gateway has the report it says "delivered"; the controller
broadcasts a cleanup to every stage that keeps per-client state (:data:`CLIENT_STATE_STAGES`), and each
drops the client's key, keeping only a small tombstone for a retention period so that late duplicates
are absorbed. A client idle for too long is reported abandoned and cleaned up the same way.

No Kafka, no clock: every function takes the state and ``now_ms`` and returns the new state (``None``:
delete the key) and the messages to send.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "TOPIC_BATCHES",
    "TOPIC_COUNTER",
    "TOPIC_AGGREGATE",
    "TOPIC_JOIN",
    "TOPIC_REPORTS",
    "CLIENT_STATE_STAGES",
    "OpeningHours",
    "Order",
    "FilterOutcome",
    "parse_order",
    "filter_batch",
    "EofConfig",
    "Emit",
    "ControllerState",
    "ControllerTransition",
    "on_sent",
    "on_report",
    "on_delivered",
    "on_controller_tick",
    "ClientTotals",
    "AggregatorTransition",
    "on_batch",
    "on_finish",
    "on_cleanup",
    "on_aggregator_tick",
    "cleanup_emits",
    "Totals",
    "ClientJoin",
    "JoinTransition",
    "on_prices",
    "on_totals",
    "on_join_cleanup",
    "on_joiner_tick",
    "join_report",
    "parse_prices",
    "is_count",
    "reference_report",
]

#: gateway -> filters, keyed ``<client>/<batch id>``: ``{"client", "batch_id", "lines"}``
TOPIC_BATCHES = "eof-batches"
#: gateway and filters -> controller, keyed by client: ``sent``, ``filtered``, ``delivered``, ticks
TOPIC_COUNTER = "eof-counter"
#: filters and controller -> group-by/aggregate stage, keyed by client: ``batch``, ``finish``, ``cleanup``, ticks
TOPIC_AGGREGATE = "eof-aggregate"
#: gateway, aggregator and controller -> joiner, keyed by client: ``prices``, ``totals``, ``cleanup``, ticks
TOPIC_JOIN = "eof-join"
#: joiner and controller -> gateway, keyed by client: the end-of-day report
TOPIC_REPORTS = "eof-reports"

#: The stages that keep state per client (besides the controller itself), by the name their input goes to:
#: the cleanup is broadcast to each of them. Every one keys its table by client, like its input topic, so
#: the one message keyed by the client reaches the one partition that may hold the client's state.
CLIENT_STATE_STAGES: tuple[str, ...] = ("aggregate", "join")

STATUS_COMPLETE = "complete"
STATUS_ABANDONED = "abandoned"
#: finished, but the gateway never said it received the report
STATUS_EXPIRED = "expired"


# --------------------------------------------------------------------------------------------- filter


@dataclass(frozen=True)
class OpeningHours:
    """Orders are accepted from ``opens`` (inclusive) to ``closes`` (exclusive), as "HH:MM" strings."""

    opens: str = "10:00"
    closes: str = "22:00"

    def accepts(self, clock: str) -> bool:
        return self.opens <= clock < self.closes


@dataclass(frozen=True)
class Order:
    """A valid order: its id, its time of day and its items as (flavour, scoops)."""

    order_id: str
    time: str
    items: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"order_id": self.order_id, "time": self.time, "items": [[flavour, scoops] for flavour, scoops in self.items]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Order:
        return cls(str(raw["order_id"]), str(raw["time"]), tuple((str(flavour), int(scoops)) for flavour, scoops in raw["items"]))


def _is_clock(value: Any) -> bool:
    if not isinstance(value, str) or len(value) != 5 or value[2] != ":":
        return False
    hours, minutes = value[:2], value[3:]
    return hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60


def parse_order(line: str, catalogue: Mapping[str, int], hours: OpeningHours) -> tuple[Order | None, str | None]:
    """The order on one line, or ``(None, reason)`` saying why the filter drops it."""
    try:
        raw = json.loads(line)
    except ValueError as error:
        return None, f"broken line: {error}"
    if not isinstance(raw, dict):
        return None, f"an order must be a JSON object, got {type(raw).__name__}"
    order_id = raw.get("order_id")
    if not isinstance(order_id, str) or not order_id:
        return None, f"'order_id' must be a non-empty string, got {order_id!r:.60}"
    clock = raw.get("time")
    if not isinstance(clock, str) or not _is_clock(clock):
        return None, f"order {order_id!r}: 'time' must be 'HH:MM', got {clock!r:.60}"
    if not hours.accepts(clock):
        return None, f"order {order_id!r}: {clock} is outside opening hours {hours.opens}-{hours.closes}"
    items = raw.get("items")
    if not isinstance(items, list) or not items:
        return None, f"order {order_id!r}: 'items' must be a non-empty list"
    parsed: list[tuple[str, int]] = []
    for number, item in enumerate(items):
        flavour = item.get("flavour") if isinstance(item, dict) else None
        scoops = item.get("scoops") if isinstance(item, dict) else None
        if flavour not in catalogue:
            return None, f"order {order_id!r} item {number}: unknown flavour {flavour!r:.60}"
        if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
            return None, f"order {order_id!r} item {number}: 'scoops' must be a positive integer, got {scoops!r:.60}"
        parsed.append((str(flavour), scoops))
    return Order(order_id, str(clock), tuple(parsed)), None


@dataclass(frozen=True)
class FilterOutcome:
    """What the filter does with one input batch: the batches it forwards (by id) and the lines it drops."""

    forwarded: list[tuple[str, list[Order]]]
    dropped: list[tuple[int, str]]


def filter_batch(
    batch_id: int, lines: list[str], catalogue: Mapping[str, int], hours: OpeningHours, max_batch_orders: int
) -> FilterOutcome:
    """Drop invalid orders; forward the rest as one batch, several (split) or none (dropped entirely).

    Deterministic: a redelivered batch forwards the same ids with the same contents.
    """
    valid: list[Order] = []
    dropped: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        order, reason = parse_order(line, catalogue, hours)
        if order is None:
            dropped.append((number, reason or "invalid"))
        else:
            valid.append(order)
    chunks = [valid[start : start + max_batch_orders] for start in range(0, len(valid), max_batch_orders)]
    return FilterOutcome([(f"{batch_id}.{number}", chunk) for number, chunk in enumerate(chunks)], dropped)


# ----------------------------------------------------------------------------------------- controller


@dataclass(frozen=True)
class EofConfig:
    """Timeouts of the end-of-stream protocol."""

    idle_timeout_ms: int
    closed_retention_ms: int


@dataclass(frozen=True)
class Emit:
    """A message to send: ``to`` is "aggregate", "join" or "reports" (keyed by the client)."""

    to: str
    value: dict[str, Any]


@dataclass(frozen=True)
class ControllerState:
    """One client in table ``eof_counters``: batches the gateway sent, reports by batch id, progress."""

    client: str
    last_activity_ms: int
    sent_total: int | None = None
    #: batch id -> batches the filter forwarded for it
    reported: dict[int, int] = field(default_factory=dict)
    finish_sent: bool = False
    #: set once cleaned up: the key is a tombstone until ``closed_ms + closed_retention_ms``
    closed_ms: int | None = None
    outcome: str | None = None

    @property
    def forwarded_total(self) -> int:
        return sum(self.reported.values())

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return self.last_activity_ms + config.idle_timeout_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "sent_total": self.sent_total,
            "reported": {str(batch): count for batch, count in self.reported.items()},
            "finish_sent": self.finish_sent,
            "closed_ms": self.closed_ms,
            "outcome": self.outcome,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ControllerState:
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            sent_total=raw.get("sent_total"),
            reported={int(batch): int(count) for batch, count in (raw.get("reported") or {}).items()},
            finish_sent=bool(raw.get("finish_sent")),
            closed_ms=raw.get("closed_ms"),
            outcome=raw.get("outcome"),
        )


@dataclass(frozen=True)
class ControllerTransition:
    """New state (None: delete the key), messages to send, and an error for the dead letters."""

    state: ControllerState | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def _fresh(previous: ControllerState | None, client: str, now_ms: int) -> ControllerState:
    return previous if previous is not None else ControllerState(client=client, last_activity_ms=now_ms)


def _maybe_finish(state: ControllerState) -> ControllerTransition:
    if state.finish_sent or state.sent_total is None or len(state.reported) < state.sent_total:
        return ControllerTransition(state)
    finish = {"kind": "finish", "client": state.client, "expected": state.forwarded_total, "batches_sent": state.sent_total}
    return ControllerTransition(replace(state, finish_sent=True), [Emit("aggregate", finish)])


def on_sent(previous: ControllerState | None, client: str, total: int, now_ms: int) -> ControllerTransition:
    """The gateway's end of a client: it sent ``total`` batches, numbered 0..total-1."""
    if previous is not None and previous.closed_ms is not None:
        return ControllerTransition(previous)  # late duplicate of a finished client
    state = _fresh(previous, client, now_ms)
    if state.sent_total is not None and state.sent_total != total:
        error = f"eof controller: client {client!r} was said to have sent {state.sent_total} batches, now {total}"
        return ControllerTransition(state, rejected=error)
    beyond = [batch for batch in state.reported if batch >= total]
    if beyond:
        error = f"eof controller: client {client!r} sent {total} batches (0..{total - 1}) but batch {beyond[0]} was reported"
        return ControllerTransition(state, rejected=error)
    return _maybe_finish(replace(state, sent_total=total, last_activity_ms=max(state.last_activity_ms, now_ms)))


def on_report(previous: ControllerState | None, client: str, batch_id: int, forwarded: int, now_ms: int) -> ControllerTransition:
    """A filter processed batch ``batch_id`` and forwarded ``forwarded`` batches for it."""
    if previous is not None and previous.closed_ms is not None:
        return ControllerTransition(previous)
    state = _fresh(previous, client, now_ms)
    known = state.reported.get(batch_id)
    if known is not None:
        if known != forwarded:
            error = f"eof controller: batch {batch_id} of client {client!r} was reported with {known} forwarded batches, now {forwarded}"
            return ControllerTransition(state, rejected=error)
        return ControllerTransition(state)  # a redelivered report
    if batch_id < 0 or forwarded < 0 or (state.sent_total is not None and batch_id >= state.sent_total):
        error = f"eof controller: report of batch {batch_id} (forwarded {forwarded}) for client {client!r} is outside 0..{state.sent_total}"
        return ControllerTransition(state, rejected=error)
    reported = {**state.reported, batch_id: forwarded}
    return _maybe_finish(replace(state, reported=reported, last_activity_ms=max(state.last_activity_ms, now_ms)))


def _close(state: ControllerState, now_ms: int, outcome: str) -> ControllerState:
    """The client's tombstone: how it ended and when, nothing of its counts."""
    return ControllerState(client=state.client, last_activity_ms=now_ms, closed_ms=now_ms, outcome=outcome)


def cleanup_emits(client: str) -> list[Emit]:
    """The cleanup broadcast: one ``cleanup`` to every stage that keeps state per client."""
    return [Emit(stage, {"kind": "cleanup", "client": client}) for stage in CLIENT_STATE_STAGES]


def on_delivered(previous: ControllerState | None, client: str, now_ms: int) -> ControllerTransition:
    """The gateway holds the client's report: every stage drops the client's keys."""
    if previous is None or previous.closed_ms is not None:
        return ControllerTransition(previous)
    return ControllerTransition(_close(previous, now_ms, STATUS_COMPLETE), cleanup_emits(client))


def on_controller_tick(state: ControllerState, config: EofConfig, now_ms: int) -> ControllerTransition:
    """Drop an expired tombstone; report an idle client abandoned and clean it up."""
    if now_ms < state.deadline_ms(config):
        return ControllerTransition(state)
    if state.closed_ms is not None:
        return ControllerTransition(None)
    emits = cleanup_emits(state.client)
    if not state.finish_sent:
        report = {
            "client": state.client,
            "status": STATUS_ABANDONED,
            "batches_sent": state.sent_total,
            "batches_reported": len(state.reported),
            "idle_ms": now_ms - state.last_activity_ms,
        }
        emits.insert(0, Emit("reports", report))
    return ControllerTransition(_close(state, now_ms, STATUS_EXPIRED if state.finish_sent else STATUS_ABANDONED), emits)


# ---------------------------------------------------------------------------------- group-by/aggregate


@dataclass(frozen=True)
class ClientTotals:
    """One client in table ``eof_totals``: totals per flavour of the batches merged so far, by batch id."""

    client: str
    last_activity_ms: int
    seen: frozenset[str] = frozenset()
    orders: int = 0
    scoops: dict[str, int] = field(default_factory=dict)
    expected: int | None = None
    flushed: bool = False
    closed_ms: int | None = None

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return _stray_deadline_ms(self.last_activity_ms, config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "seen": sorted(self.seen),
            "orders": self.orders,
            "scoops": dict(self.scoops),
            "expected": self.expected,
            "flushed": self.flushed,
            "closed_ms": self.closed_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClientTotals:
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            seen=frozenset(raw.get("seen") or ()),
            orders=int(raw.get("orders") or 0),
            scoops={str(flavour): int(count) for flavour, count in (raw.get("scoops") or {}).items()},
            expected=raw.get("expected"),
            flushed=bool(raw.get("flushed")),
            closed_ms=raw.get("closed_ms"),
        )


def _stray_deadline_ms(last_activity_ms: int, config: EofConfig) -> int:
    # The controller cleans up an idle client (it hears of every batch a filter forwards, in the same
    # transaction). This only drops a stray client it never heard of, long after: expiring here a
    # client that waits for a late finish would lose its report.
    return last_activity_ms + 10 * config.idle_timeout_ms + config.closed_retention_ms


@dataclass(frozen=True)
class AggregatorTransition:
    state: ClientTotals | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def _maybe_flush(state: ClientTotals) -> AggregatorTransition:
    if state.flushed or state.expected is None or len(state.seen) < state.expected:
        return AggregatorTransition(state)
    totals = Totals(batches=len(state.seen), orders=state.orders, scoops=dict(state.scoops))
    return AggregatorTransition(
        replace(state, flushed=True), [Emit("join", {"kind": "totals", "client": state.client, **totals.to_dict()})]
    )


def on_batch(previous: ClientTotals | None, client: str, batch_id: str, orders: Iterable[Order], now_ms: int) -> AggregatorTransition:
    """Merge one forwarded batch (group by flavour, sum the scoops), once per batch id."""
    state = previous if previous is not None else ClientTotals(client=client, last_activity_ms=now_ms)
    if state.closed_ms is not None or batch_id in state.seen:
        return AggregatorTransition(state)  # a late or redelivered batch
    if state.flushed:
        error = f"eof aggregator: client {client!r} was flushed with {state.expected} batches, then batch {batch_id!r} arrived"
        return AggregatorTransition(state, rejected=error)
    scoops = dict(state.scoops)
    count = 0
    for order in orders:
        count += 1
        for flavour, number in order.items:
            scoops[flavour] = scoops.get(flavour, 0) + number
    merged = replace(state, seen=state.seen | {batch_id}, orders=state.orders + count, scoops=scoops, last_activity_ms=now_ms)
    if merged.expected is not None and len(merged.seen) > merged.expected:
        error = f"eof aggregator: client {client!r} expects {merged.expected} batches, batch {batch_id!r} is one more"
        return AggregatorTransition(state, rejected=error)
    return _maybe_flush(merged)


def on_finish(previous: ClientTotals | None, client: str, expected: int, now_ms: int) -> AggregatorTransition:
    """The controller's word: ``expected`` batches will reach this client's aggregate, no more."""
    state = previous if previous is not None else ClientTotals(client=client, last_activity_ms=now_ms)
    if state.closed_ms is not None:
        return AggregatorTransition(state)
    if state.expected is not None and state.expected != expected:
        error = f"eof aggregator: client {client!r} was told to expect {state.expected} batches, now {expected}"
        return AggregatorTransition(state, rejected=error)
    if len(state.seen) > expected:
        error = f"eof aggregator: client {client!r} holds {len(state.seen)} batches, more than the {expected} expected"
        return AggregatorTransition(state, rejected=error)
    return _maybe_flush(replace(state, expected=expected, last_activity_ms=max(state.last_activity_ms, now_ms)))


def on_cleanup(previous: ClientTotals | None, client: str, now_ms: int) -> AggregatorTransition:
    """Drop the client's totals, keeping a tombstone that absorbs late batches for the retention."""
    if previous is not None and previous.closed_ms is not None:
        return AggregatorTransition(previous)
    return AggregatorTransition(ClientTotals(client=client, last_activity_ms=now_ms, closed_ms=now_ms))


def on_aggregator_tick(state: ClientTotals, config: EofConfig, now_ms: int) -> AggregatorTransition:
    if now_ms < state.deadline_ms(config):
        return AggregatorTransition(state)
    return AggregatorTransition(None)


# --------------------------------------------------------------------------------------------- joiner


@dataclass(frozen=True)
class Totals:
    """What the group-by/aggregate stage flushes for a client: batches merged, orders, scoops per flavour."""

    batches: int
    orders: int
    scoops: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "orders": self.orders, "scoops": dict(sorted(self.scoops.items()))}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Totals:
        return cls(int(raw["batches"]), int(raw["orders"]), {str(flavour): int(count) for flavour, count in raw["scoops"].items()})


#: The largest count or price a message may carry: integers any JSON reader holds exactly.
MAX_EXACT = 2**53


def is_count(value: Any) -> bool:
    """A non-negative integer a JSON reader holds exactly (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_EXACT


def parse_prices(raw: Any) -> dict[str, int] | None:
    """A price list (flavour -> cents per scoop, non-negative integers), or None when ``raw`` is not one."""
    if not isinstance(raw, dict):
        return None
    if not all(isinstance(flavour, str) and is_count(cents) for flavour, cents in raw.items()):
        return None
    return dict(raw)


@dataclass(frozen=True)
class ClientJoin:
    """One client in table ``eof_joins``: its price list (from the gateway) and its totals (from the aggregator)."""

    client: str
    last_activity_ms: int
    prices: dict[str, int] | None = None
    totals: Totals | None = None
    reported: bool = False
    closed_ms: int | None = None

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return _stray_deadline_ms(self.last_activity_ms, config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "prices": None if self.prices is None else dict(sorted(self.prices.items())),
            "totals": None if self.totals is None else self.totals.to_dict(),
            "reported": self.reported,
            "closed_ms": self.closed_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClientJoin:
        prices, totals = raw.get("prices"), raw.get("totals")
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            prices=None if prices is None else {str(flavour): int(cents) for flavour, cents in prices.items()},
            totals=None if totals is None else Totals.from_dict(totals),
            reported=bool(raw.get("reported")),
            closed_ms=raw.get("closed_ms"),
        )


@dataclass(frozen=True)
class JoinTransition:
    state: ClientJoin | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def join_report(client: str, totals: Totals, prices: Mapping[str, int]) -> dict[str, Any]:
    """The end-of-day report: the client's totals per flavour joined with its price list.

    A flavour sold but missing from the price list is counted at 0 cents and named in ``unpriced``.
    """
    flavours = {
        flavour: {"scoops": scoops, "revenue_cents": scoops * prices.get(flavour, 0)} for flavour, scoops in sorted(totals.scoops.items())
    }
    return {
        "client": client,
        "status": STATUS_COMPLETE,
        "batches": totals.batches,
        "orders": totals.orders,
        "flavours": flavours,
        "revenue_cents": sum(entry["revenue_cents"] for entry in flavours.values()),
        "unpriced": sorted(flavour for flavour in totals.scoops if flavour not in prices),
    }


def _maybe_join(state: ClientJoin) -> JoinTransition:
    if state.reported or state.prices is None or state.totals is None:
        return JoinTransition(state)
    return JoinTransition(replace(state, reported=True), [Emit("reports", join_report(state.client, state.totals, state.prices))])


def _joining(previous: ClientJoin | None, client: str, now_ms: int) -> ClientJoin:
    return previous if previous is not None else ClientJoin(client=client, last_activity_ms=now_ms)


def on_prices(previous: ClientJoin | None, client: str, prices: Mapping[str, int], now_ms: int) -> JoinTransition:
    """The gateway's price list for the client (one per client: the same list again changes nothing)."""
    state = _joining(previous, client, now_ms)
    if state.closed_ms is not None:
        return JoinTransition(state)  # late duplicate of a finished client
    if state.prices is not None:
        if state.prices != dict(prices):
            return JoinTransition(state, rejected=f"eof joiner: client {client!r} already has a price list, a different one arrived")
        return JoinTransition(state)
    return _maybe_join(replace(state, prices=dict(prices), last_activity_ms=max(state.last_activity_ms, now_ms)))


def on_totals(previous: ClientJoin | None, client: str, totals: Totals, now_ms: int) -> JoinTransition:
    """The aggregator's totals for the client, flushed once its count was final (again: changes nothing)."""
    state = _joining(previous, client, now_ms)
    if state.closed_ms is not None:
        return JoinTransition(state)
    if state.totals is not None:
        if state.totals != totals:
            error = f"eof joiner: client {client!r} was flushed with {state.totals.batches} batches, then totals of {totals.batches} came"
            return JoinTransition(state, rejected=error)
        return JoinTransition(state)
    return _maybe_join(replace(state, totals=totals, last_activity_ms=max(state.last_activity_ms, now_ms)))


def on_join_cleanup(previous: ClientJoin | None, client: str, now_ms: int) -> JoinTransition:
    """Drop the client's price list and totals, keeping a tombstone that absorbs late messages for the retention."""
    if previous is not None and previous.closed_ms is not None:
        return JoinTransition(previous)
    return JoinTransition(ClientJoin(client=client, last_activity_ms=now_ms, closed_ms=now_ms))


def on_joiner_tick(state: ClientJoin, config: EofConfig, now_ms: int) -> JoinTransition:
    if now_ms < state.deadline_ms(config):
        return JoinTransition(state)
    return JoinTransition(None)


def reference_report(
    client: str, lines: Iterable[str], catalogue: Mapping[str, int], hours: OpeningHours, prices: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The report computed sequentially, without the protocol (what tests compare against); ``batches`` left out.

    ``prices`` is the client's price list (default: the catalogue's prices).
    """
    orders = [order for order, _ in (parse_order(line, catalogue, hours) for line in lines) if order is not None]
    scoops: dict[str, int] = {}
    for order in orders:
        for flavour, number in order.items:
            scoops[flavour] = scoops.get(flavour, 0) + number
    report = join_report(client, Totals(0, len(orders), scoops), catalogue if prices is None else prices)
    del report["batches"]
    return report
