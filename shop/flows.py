"""The shop's dispatch, declared with weir's flow API (``WEIR_AGENTS=flows`` with ``WEIR_FLOWS=shop.flows`` runs them).

Seed 002's two-phase commit, in its sequence, as a flow with two barriers keyed by the order's ticket:

    open ─▶ check ─▶ barrier await-payment ─▶ reserve ─▶ to kitchen ─▶ barrier await-kitchen ─▶ settle ─▶ to payments,
            (the gateway's answer to the capture)    (captured only)      (every flavour's answer)         kitchen, outcomes,
                                                                                                           the end of day

The gateway's and the kitchen's answers are flows of their own (they read ``shop.payment-answers`` and
``shop.kitchen-answers``), whose executions the barriers await: the payment once, the kitchen once per flavour
reserved (``Await(count=..., distinct_by=...)``), each with its answer as the execution's result. A rejected card
reserves nothing, so the kitchen's wait awaits zero answers and ends at once. At a timeout the order goes on
(``on_timeout="continue"``) and is aborted there, with the reason the screens have always got.
"""

from __future__ import annotations

from typing import Any

from shop.settings import ShopSettings
from shop.state import DAY_AGGREGATE, DAY_COUNTER, DispatchOrder, Send, WaitEnd, read_answer, reservations, settle
from weir.app.flows import Await, Exchange, Flow, payload

__all__ = ["FLOWS", "FLOWS_SETTING", "describe", "PAYMENT_ANSWERS", "KITCHEN_ANSWERS", "DISPATCH", "AWAIT_PAYMENT", "AWAIT_KITCHEN"]

#: The setting that names these flows: ``WEIR_FLOWS=shop.flows`` (the dispatch worker runs weir's ``flows`` agents).
FLOWS_SETTING = "shop.flows"
#: The flows' and barriers' names (tables ``barrier-<name>``, topics ``flow.<name>.*`` and ``barrier.<name>``).
DISPATCH = "shop-dispatch"
PAYMENT_ANSWERS = "shop-payment-answers"
KITCHEN_ANSWERS = "shop-kitchen-answers"
AWAIT_PAYMENT = "shop-await-payment"
AWAIT_KITCHEN = "shop-await-kitchen"


def check_payment_answer(exchange: Exchange) -> None:
    """An answer that is not one fails its execution (dead letter); the order waiting for it goes on as failed."""
    read_answer(exchange.payload, kitchen=False)


def check_kitchen_answer(exchange: Exchange) -> None:
    read_answer(exchange.payload, kitchen=True)


def check_open(exchange: Exchange) -> None:
    DispatchOrder.from_open(exchange.payload)


def wait_end(exchange: Exchange, barrier: str, flow: str) -> WaitEnd:
    """How the wait at ``barrier`` ended for this order, and the answers of ``flow`` it got (its report)."""
    report = exchange.properties["barriers"][barrier]
    answers = tuple(answer for answer in report["results"].get(flow, []) if isinstance(answer, dict))
    return WaitEnd(str(report["status"]), answers, report.get("error"))


def _by_topic(sends: list[Send]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for send in sends:
        grouped.setdefault(send.to, []).append(send.value)
    return grouped


def reserve(exchange: Exchange) -> dict[str, Any]:
    """After the payment's wait: the open, with the reservations to send (none unless captured)."""
    order = DispatchOrder.from_open(exchange.payload)
    sends = reservations(order, wait_end(exchange, AWAIT_PAYMENT, PAYMENT_ANSWERS))
    return {**exchange.payload, "reservations": [send.value for send in sends]}


def settle_order(exchange: Exchange) -> dict[str, Any]:
    """After the kitchen's wait: commit and deliver, or void and release; and the order's outcome."""
    order = DispatchOrder.from_open(exchange.payload)
    payment = wait_end(exchange, AWAIT_PAYMENT, PAYMENT_ANSWERS)
    kitchen = wait_end(exchange, AWAIT_KITCHEN, KITCHEN_ANSWERS)
    return _by_topic(settle(order, payment, kitchen))


def reservations_sent(exchange: Exchange) -> int:
    return len(exchange.payload["reservations"])


def _each(name: str) -> Any:
    """The payloads of the settlement for topic ``name`` (``shop.<name>``, or an end of day's topic; none when it sends
    nothing there)."""

    def read(exchange: Exchange) -> list[dict[str, Any]]:
        return list(exchange.payload.get(name, []))

    return read


def _flows(timeout_ms: int) -> list[Flow]:
    payment_answers = Flow(PAYMENT_ANSWERS, source="shop.payment-answers").process("check", check_payment_answer)
    kitchen_answers = Flow(KITCHEN_ANSWERS, source="shop.kitchen-answers").process("check", check_kitchen_answer)
    dispatch = (
        # One execution per ticket: an open sent twice (a replayed orders stage) waits once and settles once.
        Flow(DISPATCH, source="shop.dispatch", id_by=payload("ticket"))
        .process("check", check_open)
        .barrier(
            AWAIT_PAYMENT,
            awaits=[Await("shop.payment-answers", key=payload("order_id"), results=True)],
            timeout_ms=timeout_ms,
            on_timeout="continue",
            on_failure="continue",
        )
        .process("reserve", reserve)
        .to("shop.kitchen", "reserve-flavours", each=payload("reservations"), key=payload("flavour"))
        .barrier(
            AWAIT_KITCHEN,
            awaits=[
                Await(
                    "shop.kitchen-answers",
                    key=payload("order_id"),
                    count=reservations_sent,
                    distinct_by=payload("flavour"),
                    results=True,
                )
            ],
            timeout_ms=timeout_ms,
            on_timeout="continue",
            on_failure="continue",
        )
        .process("settle", settle_order)
        .to("shop.payments", "commit-or-void", each=_each("payments"), key=payload("order_id"))
        .to("shop.kitchen", "deliver-or-release", each=_each("kitchen"), key=payload("flavour"))
        .to("shop.outcomes", "outcome", each=_each("outcomes"), key=payload("ticket"))
        # The outcome is the end of day's filter output (shop/day.py): forwarded, and reported to its controller.
        .to(DAY_AGGREGATE, "day-outcome", each=_each(DAY_AGGREGATE), key=payload("client"))
        .to(DAY_COUNTER, "day-count", each=_each(DAY_COUNTER), key=payload("client"))
    )
    return [payment_answers, kitchen_answers, dispatch]


#: The shop's flows: the dispatch and the two flows of answers it awaits.
FLOWS = _flows(ShopSettings.from_env().dispatch_timeout_ms)


def describe() -> list[str]:
    """Each flow and its steps, in order (what the demo prints)."""
    return [f"{flow.name} (reads {flow.source}): {' -> '.join(step.name for step in flow.steps)}" for flow in FLOWS]
