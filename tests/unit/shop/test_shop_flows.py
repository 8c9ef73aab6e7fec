"""The shop's dispatch as declared flows (shop/flows.py): the graph weir validates, the steps' reading of the
barriers' reports, and the shop's workers running them on weir's flows agents."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from shop.demo import STAGES, WORKER_ENV
from shop.flows import AWAIT_KITCHEN, AWAIT_PAYMENT, DISPATCH, FLOWS, KITCHEN_ANSWERS, PAYMENT_ANSWERS, reserve, settle_order
from shop.state import CARD_DECLINED
from weir.app.flows import Exchange, validate_flows
from weir.app.settings import load_settings

OPEN = {
    "kind": "open",
    "order_id": "day/s/3",
    "ticket": "day/s/3",
    "screen": "day/s",
    "line": 3,
    "order": {"order_id": "o-3", "scoops": {"mint": 1, "lemon": 2}, "amount_cents": 900},
    "deadline_ms": 0,
}


def _report(status: str, flow: str, answers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": status, "error": None, "missing": [], "results": {flow: answers} if answers else {}}


def test_the_dispatch_is_a_flow_with_the_payment_barrier_then_the_kitchen_barrier() -> None:
    by_source = validate_flows(FLOWS)
    dispatch = by_source["shop.dispatch"]
    assert dispatch.name == DISPATCH
    kinds = [(step.kind, step.name) for step in dispatch.steps]
    assert kinds.index(("barrier", AWAIT_PAYMENT)) < kinds.index(("process", "reserve")) < kinds.index(("barrier", AWAIT_KITCHEN))
    payment, kitchen = dispatch.barriers()
    assert [awaited.source for awaited in payment.awaits] == ["shop.payment-answers"]
    assert [awaited.source for awaited in kitchen.awaits] == ["shop.kitchen-answers"]
    assert kitchen.awaits[0].count is not None, "the kitchen's wait counts one answer per flavour reserved"
    assert (payment.on_timeout, kitchen.on_timeout) == ("continue", "continue"), "a timeout aborts the order, it is not lost"


def test_a_rejected_card_reserves_nothing_and_settles_aborted_with_the_gateway_reason() -> None:
    answer = {"kind": "payment", "order_id": "day/s/3", "ok": False, "reason": CARD_DECLINED}
    exchange = Exchange(OPEN, properties={"barriers": {AWAIT_PAYMENT: _report("completed", PAYMENT_ANSWERS, [answer])}})
    exchange.payload = reserve(exchange)
    assert exchange.payload["reservations"] == []
    exchange.properties["barriers"][AWAIT_KITCHEN] = _report("completed", KITCHEN_ANSWERS, [])
    settlement = settle_order(exchange)
    assert sorted(settlement) == ["eof-aggregate", "eof-counter", "outcomes"]
    assert settlement["outcomes"][0]["reason"] == CARD_DECLINED


def test_a_captured_order_reserves_each_flavour_and_settles_ready_when_each_is_reserved() -> None:
    answer = {"kind": "payment", "order_id": "day/s/3", "ok": True, "reason": None}
    exchange = Exchange(OPEN, properties={"barriers": {AWAIT_PAYMENT: _report("completed", PAYMENT_ANSWERS, [answer])}})
    exchange.payload = reserve(exchange)
    assert [(item["flavour"], item["scoops"]) for item in exchange.payload["reservations"]] == [("lemon", 2), ("mint", 1)]
    kitchen = [{"kind": "kitchen", "order_id": "day/s/3", "flavour": flavour, "ok": True, "reason": None} for flavour in ("lemon", "mint")]
    exchange.properties["barriers"][AWAIT_KITCHEN] = _report("completed", KITCHEN_ANSWERS, kitchen)
    settlement = settle_order(exchange)
    assert [item["kind"] for item in settlement["payments"]] == ["commit"]
    assert [(item["kind"], item["flavour"]) for item in settlement["kitchen"]] == [("deliver", "lemon"), ("deliver", "mint")]
    assert (settlement["outcomes"][0]["status"], settlement["outcomes"][0]["amount_cents"]) == ("ready", 900)


def test_the_shops_dispatch_is_weirs_flows_agent_set_running_the_shops_flows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "flows" in STAGES
    for name, value in WORKER_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WEIR_AGENTS", "flows")
    settings = load_settings()
    assert settings.flows_module == "shop.flows"
    assert importlib.import_module(settings.flows_module).FLOWS is FLOWS
