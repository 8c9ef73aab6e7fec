"""A barrier whose awaits correlate by keys of their own (seed 004), on the real broker with a real worker.

Each shipment waits under its order id for the kitchen, and for the payment under its payment reference.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from app.kafka_io import ensure_topics, read_topic
from tests.integration.conftest import Pipeline
from tests.integration.test_barrier import send

pytestmark = pytest.mark.integration

TOPICS = ["cook-in", "pay-in", "ship-in", "shipped", "dead-letters", "barrier.gate"]
TOPICS += [f"flow.{name}.{kind}" for name in ("cook", "pay", "ship") for kind in ("resume", "outcomes")]


def read(pipeline: Pipeline, topic: str, *, expected: int, timeout_s: float) -> list[dict[str, Any]]:
    name = pipeline.topic(topic)
    asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: len(rows) >= expected, timeout_s=timeout_s))
    time.sleep(2)  # a second copy would be there by now
    return asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: False, timeout_s=3.0, decode=orjson.loads))


def test_each_await_under_its_own_key_releases_once_and_a_completion_under_the_wrong_key_counts_for_nothing(
    pipeline: Pipeline,
) -> None:
    """20 shipments; their kitchen and payment completions come before, after or between, each under its own key.
    Shipment 20's payment never comes; a payment whose reference happens to equal its order id does: it must
    not release it; it times out naming the payment's own key."""
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    worker = pipeline.start_worker("flows", WEIR_FLOWS="tests.integration.relay_flows", TEST_BARRIER_TIMEOUT_MS=12_000)
    worker.wait_ready()
    orders = [(f"o-{number}", f"p-{number}") for number in range(21)]
    early = orders[:7]  # payment and kitchen before the shipment arrives
    send(pipeline, "cook-in", [(order, {"order_id": order}, {}) for order, _ in early])
    send(pipeline, "pay-in", [(ref, {"payment_ref": ref}, {}) for _, ref in early])
    time.sleep(2)
    send(pipeline, "ship-in", [(order, {"order_id": order, "payment_ref": ref}, {}) for order, ref in orders])
    send(pipeline, "cook-in", [(order, {"order_id": order}, {}) for order, _ in orders[7:]])
    send(pipeline, "pay-in", [(ref, {"payment_ref": ref}, {}) for _, ref in orders[7:20]])
    send(pipeline, "pay-in", [("o-20", {"payment_ref": "o-20"}, {})])  # the wrong key for shipment o-20's payment
    shipped = read(pipeline, "shipped", expected=20, timeout_s=60)
    counts = Counter(record["order_id"] for record in shipped)
    assert sorted(counts) == sorted(order for order, _ in orders[:20])
    assert set(counts.values()) == {1}, f"shipped twice: {counts.most_common(3)}"
    letters = [
        letter
        for letter in read(pipeline, "dead-letters", expected=1, timeout_s=40)
        if letter.get("step") == "gate" and letter.get("reason") == "timeout"
    ]
    [letter] = letters
    assert letter["key"]["text"] == "o-20"
    assert letter["awaiting"] == [{"flow": "pay", "key": "p-20"}]
