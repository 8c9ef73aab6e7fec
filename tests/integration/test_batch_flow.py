"""A correlation aggregate in a flow (Camel's and Spring's aggregator): exchanges grouped by key, no split before.

Real broker, real `faust worker` processes running tests/integration/batch_flows.py; batches read read_committed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from tests.integration.test_barrier import send
from weir.app.kafka_io import ensure_topics, read_to_end, read_topic
from weir.app.processes import WorkerProcess

pytestmark = pytest.mark.integration

TOPICS = ["clicks", "click-batches", "dead-letters", "flow.clicks.per-customer.results", "flow.clicks.resume", "flow.clicks.outcomes"]
CUSTOMERS = [f"c{number}" for number in range(10)]


def start(pipeline: Pipeline) -> WorkerProcess:
    return pipeline.start_worker("flows", WEIR_FLOWS="tests.integration.batch_flows")


def batches(pipeline: Pipeline, *, expected: int, timeout_s: float) -> list[dict[str, Any]]:
    name = pipeline.topic("click-batches")
    asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: len(rows) >= expected, timeout_s=timeout_s))
    time.sleep(2)  # then read again: a second copy of a batch would be there by now
    return asyncio.run(read_to_end(pipeline.bootstrap, name, decode=orjson.loads))


def test_reopening_batches_of_three_put_every_click_in_exactly_one_batch_in_order(pipeline: Pipeline) -> None:
    """990 clicks of 10 customers, keyed by customer, shuffled between customers (in order per customer), sent through
    2 workers, one SIGKILLed mid-run: every click in exactly one batch, each customer's batches numbered
    0..32 in order and holding its clicks in order; one customer's ``end`` click closes a batch of 2."""
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    rng = random.Random(5)
    queues = {customer: [{"customer": customer, "n": n} for n in range(99)] for customer in CUSTOMERS}
    queues["c0"][1]["end"] = True  # c0's first batch closes at its second click: [0, 1], then [2, 3, 4] ...
    queues["c0"] += [{"customer": "c0", "n": 99}, {"customer": "c0", "n": 100}]  # ... so c0 needs two more for its last batch
    clicks: list[dict[str, Any]] = []
    while any(queues.values()):
        customer = rng.choice([name for name, queue in queues.items() if queue])
        clicks.append(queues[customer].pop(0))
    first, second = start(pipeline), start(pipeline)
    first.wait_ready()
    second.wait_ready()
    # Keyed by customer, as a producer that wants them in order per customer sends them (Kafka orders per partition).
    records = [(click["customer"], click, {"source": f"click-{number}"}) for number, click in enumerate(clicks)]
    send(pipeline, "clicks", records[:500])
    asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic("click-batches"), until=lambda rows: len(rows) >= 40, timeout_s=90))
    second.kill()
    send(pipeline, "clicks", records[500:])
    found = batches(pipeline, expected=331, timeout_s=180)
    by_customer: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for batch in found:
        by_customer[batch["customer"]].append(batch)
    assert sorted(by_customer) == CUSTOMERS
    for customer, batches_of in by_customer.items():
        numbers = [batch["sequence"] for batch in batches_of]
        assert numbers == list(range(len(batches_of))), f"{customer}: batches out of order or twice: {numbers}"
        grouped = [n for batch in batches_of for n in batch["clicks"]]
        sent = [click["n"] for click in clicks if click["customer"] == customer]
        assert grouped == sent, f"{customer}: every click once, in order"
        sizes = [len(batch["clicks"]) for batch in batches_of]
        if customer == "c0":
            assert sizes == [2] + [3] * 33
            assert [batch["reason"] for batch in batches_of[:2]] == ["flag", "size"]
        else:
            assert sizes == [3] * 33
    assert len(found) == 331
    assert {batch["first_header"] for batch in found} <= {record[2]["source"] for record in records}
