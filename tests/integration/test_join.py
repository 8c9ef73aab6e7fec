"""A worker joins its consumer groups only once the broker lists every topic it subscribes to (``app.engine.fetcher.until_listed``).

The group's leader assigns the partitions its metadata knows: a changelog topic created a moment before the
join was missing from a static member's first assignment, and that member got the same assignment back at
every restart (session 7's chaos run: a payments worker restored nothing). These tests pin the wait itself
on the real broker: it returns only after a topic created meanwhile is listed, and gives up after its time.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaClient

from weir.app.engine.fetcher import until_listed
from weir.app.kafka_io import ensure_topics

pytestmark = pytest.mark.integration


def test_the_join_waits_until_a_topic_created_meanwhile_is_listed(kafka_bootstrap: str) -> None:
    asyncio.run(created_meanwhile(kafka_bootstrap))


async def created_meanwhile(kafka_bootstrap: str) -> None:
    existing, created = f"join-{uuid.uuid4().hex[:8]}", f"join-changelog-{uuid.uuid4().hex[:8]}"
    await ensure_topics(kafka_bootstrap, [existing], 2)
    client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
    await client.bootstrap()
    try:
        waiting = asyncio.ensure_future(until_listed(client, {existing, created}, within_s=30))
        await asyncio.sleep(1.0)
        assert not waiting.done(), f"returned before {created} existed: {waiting.result()}"
        await ensure_topics(kafka_bootstrap, [created], 2)
        assert await asyncio.wait_for(waiting, 15) == []
        assert len((await client.fetch_all_metadata()).partitions_for_topic(created) or ()) == 2
    finally:
        await client.close()


def test_the_wait_gives_up_after_its_time_and_names_what_is_missing(kafka_bootstrap: str) -> None:
    asyncio.run(never_created(kafka_bootstrap))


async def never_created(kafka_bootstrap: str) -> None:
    missing = f"join-never-{uuid.uuid4().hex[:8]}"
    client = AIOKafkaClient(bootstrap_servers=kafka_bootstrap)
    await client.bootstrap()
    try:
        began = time.monotonic()
        assert await until_listed(client, {missing}, within_s=0.5) == [missing]
        assert 0.5 <= time.monotonic() - began < 10
    finally:
        await client.close()
