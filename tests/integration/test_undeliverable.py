"""A result that cannot be written (larger than the broker takes) is handled for its group alone, on the real broker.

An order's items each give a 90 KB result: twelve of them merge into a result of 1.08 MB, over the broker's
``message.max.bytes`` and the producer's limit (each open state on the way, eleven items at most, fits).
Completed by flag (every item arrived) and, for a group opened for 40,000 items none of which comes, by
timeout (a result listing 40,000 missing items, 1.6 MB): each group is done with status ``dead-lettered``,
its full result is one dead letter that fits a record (cut, with its size and sha256), an outline with status
``dead-lettered`` is sent in the result's place, and ordinary orders on the same worker and partitions
complete. The worker never restarts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics, produce_json, read_to_end, read_topic

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
BROKER_LIMIT = 1_048_588  # message.max.bytes of the local broker (Kafka's default)


def _big(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, "items": [{"value": f"{order_id}/{index}", "inflate": 90_000} for index in range(12)]}


def test_a_result_over_the_broker_limit_is_dead_lettered_for_its_group_alone(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    worker = pipeline.start_worker("all", WEIR_SPLIT_CHUNK=1)
    worker.wait_ready(120)
    small = {
        f"small-{number}": {"order_id": f"small-{number}", "items": [{"value": f"s{number}/{i}"} for i in range(3)]} for number in range(20)
    }
    orders = {"big-by-count": _big("big-by-count"), **small}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), list(orders.items())))
    # A group announced for 40,000 items, as a splitter's open, none of which will come: it completes by timeout.
    opened = {"kind": "open", "correlation_id": "big-by-timeout", "total": 40_000, "deadline_ms": int(time.time() * 1000) + 3_000}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [("big-by-timeout", opened)]))
    orders["big-by-timeout"] = opened

    results = asyncio.run(
        read_topic(
            pipeline.bootstrap,
            pipeline.topic("aggregates"),
            until=lambda rows: {row["correlation_id"] for row in rows} >= set(orders),
            timeout_s=120,
            decode=orjson.loads,
        )
    )
    by_order: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_order.setdefault(result["correlation_id"], []).append(result)
    assert all(len(rows) == 1 for rows in by_order.values()), "one result per group"
    for order_id in small:
        assert by_order[order_id][0]["status"] == "complete"
    for order_id, reason in (("big-by-count", "flag"), ("big-by-timeout", "timeout")):
        [outline] = by_order[order_id]
        assert (outline["status"], outline["reason"]) == ("dead-lettered", reason), outline
        assert outline["size_bytes"] > BROKER_LIMIT
        assert len(outline["sha256"]) == 64
    outline = by_order["big-by-timeout"][0]
    assert (outline["missing_count"], len(outline["missing"])) == (40_000, 100), "the outline counts what it lacked, and lists a sample"

    letters = asyncio.run(
        read_topic(
            pipeline.bootstrap,
            pipeline.topic("dead-letters"),
            until=lambda rows: sum(row["reason"] == "undeliverable" for row in rows) >= 2,
            timeout_s=30,
            decode=orjson.loads,
        )
    )
    undeliverable = {letter["key"]["text"]: letter for letter in letters if letter["reason"] == "undeliverable"}
    assert set(undeliverable) == {"big-by-count", "big-by-timeout"}
    for order_id, letter in undeliverable.items():
        assert letter["agent"] == "aggregator"
        assert letter["value"]["truncated"]
        assert letter["value"]["size_bytes"] == by_order[order_id][0]["size_bytes"]
        assert letter["value"]["sha256"] == by_order[order_id][0]["sha256"]

    done = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates_done-changelog"), decode=orjson.loads))
    statuses = {row["correlation_id"]: row["status"] for row in done if row is not None}
    assert statuses["big-by-count"] == statuses["big-by-timeout"] == "dead-lettered"
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker kept running"
    assert worker.log_text().count("Worker ready") == 1
