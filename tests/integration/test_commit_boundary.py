"""A transaction commits the offsets of every event whose outputs it commits (real broker, real worker).

An event still in flight when a commit begins finishes inside that commit's transaction (the commit waits for
it): its outputs are committed then. Its offset must be committed in the same transaction. Otherwise a crash
before the next commit replays the event, and its outputs go out twice.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics

pytestmark = pytest.mark.integration


def item(correlation_id: str, sleep_s: float) -> bytes:
    payload = {"value": correlation_id, "sleep_s": sleep_s}
    return orjson.dumps({"correlation_id": correlation_id, "total": 1, "index": 0, "payload": payload})


async def committed_offset(admin: AIOKafkaAdminClient, group: str, tp: TopicPartition) -> int:
    offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    found = offsets.get(tp)
    return found.offset if found is not None else -1


async def outputs_and_offsets(pipeline: Pipeline) -> tuple[dict[str, float], dict[str, tuple[int, float]]]:
    """Sends three item messages to an items worker and watches its results and its committed offsets.

    ``slow`` (partition 0) sleeps 1.5 s; ``quick`` (partition 1) and ``long`` (partition 2) come while it runs,
    and are taken together as the next batch once it is done (a worker takes one batch at a time). ``long``
    sleeps 4 s: the commit due after ``slow`` closes the gate while that batch is in flight and waits for it,
    so ``quick`` and ``long`` finish inside its transaction.
    Returns when each result was read (read_committed), and when the committed offset of each message's
    partition first passed it. Watches until it has both for every message: the reader's fetch may come a
    moment after the offsets are seen (stopping on the offsets alone once read no result at all).
    """
    items, results = pipeline.topic("items"), pipeline.topic("item-results")
    sends = {"slow": (0, 1.5, 0.0), "quick": (1, 0.0, 0.3), "long": (2, 4.0, 0.8)}  # partition, sleep, send at
    producer = AIOKafkaProducer(bootstrap_servers=pipeline.bootstrap, enable_idempotence=True)
    reader = AIOKafkaConsumer(
        results, bootstrap_servers=pipeline.bootstrap, group_id=None, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    await producer.start()
    await reader.start()
    await admin.start()
    seen: dict[str, float] = {}
    covered: dict[str, tuple[int, float]] = {}
    try:
        started = time.monotonic()
        offsets: dict[str, int] = {}
        for name, (partition, sleep_s, send_at) in sends.items():
            await asyncio.sleep(max(0.0, started + send_at - time.monotonic()))
            metadata = await producer.send_and_wait(items, key=name.encode(), value=item(name, sleep_s), partition=partition)
            offsets[name] = metadata.offset
        deadline = time.monotonic() + 60
        while (len(covered) < len(sends) or len(seen) < len(sends)) and time.monotonic() < deadline:
            batch = await reader.getmany(timeout_ms=50)
            now = time.monotonic()
            for records in batch.values():
                for record in records:
                    value = orjson.loads(record.value)
                    for message in value["messages"] if value.get("kind") == "bundle" else [value]:
                        seen.setdefault(message["correlation_id"], now)
            for name, (partition, _, _) in sends.items():
                if name not in covered:
                    offset = await committed_offset(admin, f"{pipeline.app_id}-items", TopicPartition(items, partition))
                    if offset > offsets[name]:
                        covered[name] = (offset, time.monotonic())
        return seen, covered
    finally:
        await admin.close()
        await reader.stop()
        await producer.stop()


def test_an_event_that_finishes_inside_a_commit_has_its_offset_committed_with_its_outputs(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in ("items", "item-results", "dead-letters")], 4))
    worker = pipeline.start_worker("items", WEIR_GUARANTEE="exactly_once")
    worker.wait_ready()
    seen, covered = asyncio.run(outputs_and_offsets(pipeline))
    assert set(seen) == {"slow", "quick", "long"}, f"results read: {sorted(seen)}"
    assert set(covered) == {"slow", "quick", "long"}, f"offsets committed past: {sorted(covered)}"
    for name, read_at in seen.items():
        _, committed_at = covered[name]
        # The result and the offset commit in one transaction: the offset is visible at most a moment after
        # the result (the coordinator writes the markers of the data and offsets partitions side by side).
        # Without it, the offset of 'slow' came only with the next commit, after 'long' (4 s).
        assert committed_at - read_at < 1.0, f"{name}: offset committed {committed_at - read_at:.2f} s after its result was read"
