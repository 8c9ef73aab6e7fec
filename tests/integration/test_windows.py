"""A windowed count on the real broker across a SIGKILL: out-of-order records (within the grace) by their own Kafka
timestamps, the worker killed mid-stream and restarted in its slot; each window's final result is on the output
topic once, read committed, and equals the count computed from the records. What only a broker shows: the
window's state, stream time and results in one transaction, restored from the changelogs after the kill."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics, key_partition, read_to_end, read_topic

pytestmark = pytest.mark.integration

WINDOW_MS = 1_000
ENV: dict[str, Any] = {"WEIR_WINDOWS": "tests.integration.window_defs", "WEIR_PARTITIONS": "4", "WEIR_COMMIT_INTERVAL": "0.1"}


async def send(bootstrap: str, topic: str, records: list[tuple[str, int]], *, partition: int | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for key, stamp in records:
            await producer.send_and_wait(topic, b"{}", key=key.encode(), timestamp_ms=stamp, partition=partition)
    finally:
        await producer.stop()


def recent_base() -> int:
    """An hour ago, on a window's start: the broker's retention (7 days by the records' timestamps) keeps such records
    for the whole test, where older ones may be deleted under the worker (its fetch then resets past them)."""
    now = int(time.time() * 1000)
    return now - now % WINDOW_MS - 3_600_000


def test_a_windowed_count_over_out_of_order_records_across_a_sigkill_gives_each_window_one_final_result(pipeline: Pipeline) -> None:
    rng = random.Random(11)
    base = recent_base()
    # 1,200 clicks of 12 users over 40 s, each up to 400 ms out of order (the grace is 500 ms: none is late)
    records = [(f"user-{rng.randrange(12)}", base + n * 33 + rng.randint(0, 400)) for n in range(1_200)]
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic("clicks"), pipeline.topic("click-counts")], 4))
    worker = pipeline.start_worker("windows", **ENV)
    worker.wait_ready()
    asyncio.run(send(pipeline.bootstrap, pipeline.topic("clicks"), records[:600]))

    def finals(rows: list[Any]) -> list[dict[str, Any]]:
        values = [orjson.loads(row.value) for row in rows]
        return [value for value in values if value["final"] and value["key"] != "flush"]

    # mid-stream: the worker has closed and sent some windows (and, its stream time at most 20 s in, not the later ones)
    before = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("click-counts"), until=lambda rows: len(finals(rows)) >= 5, timeout_s=60)
    )
    assert len(finals(before)) >= 5, "the worker sent no window's result before the kill"
    worker.kill()  # SIGKILL with windows open, some results sent and some not
    restarted = pipeline.start_worker("windows", web_port=worker.web_port, **ENV)
    restarted.wait_ready()
    asyncio.run(send(pipeline.bootstrap, pipeline.topic("clicks"), records[600:]))
    # a last record per partition, far later: stream time passes every window's close
    far = base + 3_600_000
    for partition in range(4):
        asyncio.run(send(pipeline.bootstrap, pipeline.topic("clicks"), [("flush", far)], partition=partition))

    expected = Counter((key, stamp - stamp % WINDOW_MS) for key, stamp in records)
    assert len(finals(before)) < len(expected), "the kill came after every window had its result"

    rows = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("click-counts"), until=lambda rows: len(finals(rows)) >= len(expected), timeout_s=120)
    )
    results = finals(rows)
    per_window = Counter((value["key"], value["start_ms"]) for value in results)
    assert [window for window, times in per_window.items() if times > 1] == [], "a window's final result went out twice"
    assert {(value["key"], value["start_ms"]): value["value"] for value in results} == dict(expected)
    assert asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dead-letters"))) == [], "no record was late or invalid"


def test_a_window_step_of_a_flow_counts_by_the_records_own_kafka_timestamps(pipeline: Pipeline) -> None:
    """What only a broker shows: the event time of a flow's exchange is its source record's Kafka timestamp (Faust's, in
    seconds), carried to the window step's records; each window's result runs the rest of the flow once."""
    base = recent_base()
    records = [(f"user-{number % 3}", base + number * 100) for number in range(40)]  # 4 s of clicks, in order
    source, counts = pipeline.topic("flow-clicks"), pipeline.topic("flow-click-counts")
    asyncio.run(ensure_topics(pipeline.bootstrap, [source, counts], 4))
    worker = pipeline.start_worker("flows", WEIR_FLOWS="tests.integration.window_defs", WEIR_PARTITIONS="4")
    worker.wait_ready()
    asyncio.run(send(pipeline.bootstrap, source, records))
    # a later record for a key of each partition of the window step's records topic: every window closes
    keys = [f"k{number}" for number in range(40)]
    flushes = [next(key for key in keys if key_partition(key.encode(), 4) == partition) for partition in range(4)]
    asyncio.run(send(pipeline.bootstrap, source, [(key, base + 60_000) for key in flushes]))
    expected = Counter((key, stamp - stamp % WINDOW_MS) for key, stamp in records)

    def results(rows: list[Any]) -> list[dict[str, Any]]:
        return [value for value in (orjson.loads(row.value) for row in rows) if value["key"] not in flushes]

    rows = asyncio.run(read_topic(pipeline.bootstrap, counts, until=lambda rows: len(results(rows)) >= len(expected), timeout_s=120))
    assert {(value["key"], value["start_ms"]): value["value"] for value in results(rows)} == dict(expected)
    assert len(results(rows)) == len(expected), "each window's result went through the flow once"
