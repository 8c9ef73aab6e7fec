"""The dispatch flow's barriers going on at their timeout: with the payment gateway down, every order is aborted
'timeout waiting for payment' and the kitchen never hears of it; when the gateway comes back, each capture it then
makes is voided (the dispatch's void follows the capture in its partition), none is left open or committed."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import orjson
import pytest

from shop.demo import ENTRY, run_shop
from shop.screens import payments_by_state
from tests.integration.conftest import Pipeline
from tests.integration.test_shop import SHOP_ENV
from weir.app.kafka_io import read_to_end

#: the shop's and the chaos run's workers load the 2 cores: these modules run one after another in one pytest process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shop")]

TIMEOUT_MS = 3_000


def _line(order_id: str, flavour: str) -> str:
    return json.dumps({"order_id": order_id, "card": "4111111111111111", "items": [{"flavour": flavour, "size": "small"}]})


def test_orders_time_out_at_the_payment_barrier_and_late_captures_are_voided(pipeline: Pipeline) -> None:
    env = {**SHOP_ENV, "WEIR_SHOP_CARD_REJECT_RATE": 0.0, "WEIR_SHOP_DISPATCH_TIMEOUT_MS": TIMEOUT_MS}
    stages = ("shop_orders,shop_claims", "shop_kitchen", "flows", "eof_controller,eof_aggregator,eof_joiner")
    running = [pipeline.start_worker(agents, entry=ENTRY, **env) for agents in stages]
    for worker in running:
        worker.wait_ready()
    screens = {"screen-1": [_line(f"o-{number}", "vanilla") for number in range(1, 4)]}
    result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=60, settle_timeout_s=1))
    outcomes = result["progress"]["screen-1"].outcomes
    assert [(outcome["status"], outcome["reason"]) for outcome in outcomes] == [("aborted", "timeout waiting for payment")] * 3
    assert result["reports"]["screen-1"]["aborted_by_reason"] == {"timeout": 3}

    gateway = pipeline.start_worker("shop_payments", entry=ENTRY, **env)
    gateway.wait_ready()
    deadline = time.monotonic() + 60
    payments: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        payments = asyncio.run(payments_by_state(pipeline.bootstrap, pipeline.topic))
        if len(payments) == 3 and all(payment["state"] == "voided" for payment in payments.values()):
            break
        time.sleep(1)
    assert Counter(payment["state"] for payment in payments.values()) == {"voided": 3}, payments
    kitchen = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("shop.kitchen")))
    asked = [message for message in (orjson.loads(record.value) for record in kitchen) if message.get("kind") != "tick"]
    assert asked == [], "an order without a capture never reaches the kitchen"
