"""Replication settings on the real broker (issue 37): the factor and ``min.insync.replicas`` reach every topic a
worker creates, its tables' changelogs included; a factor the cluster cannot hold is refused in one line before
any topic is created (Kafka would refuse each topic, and the worker used to stop on the first with a traceback).

The local broker is one node: a cluster of three, and a broker lost under a factor of 3, are not tested here."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics
from weir.app.settings import SettingError

pytestmark = pytest.mark.integration

#: DescribeConfigs' config_source for a value set on the topic itself (5 is the broker's default).
TOPIC_LEVEL = 1


async def topics_with_prefix(bootstrap: str, prefix: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return sorted(name for name in await admin.list_topics() if name.startswith(prefix))
    finally:
        await admin.close()


async def topic_settings(bootstrap: str, names: list[str], setting: str) -> dict[str, tuple[str, int]]:
    """``setting``'s value and config source on each topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    finally:
        await admin.close()
    found: dict[str, tuple[str, int]] = {}
    for response in responses:
        for _error, _message, _type, name, entries in response.resources:
            for entry in entries:
                if entry[0] == setting:
                    found[name] = (entry[1], entry[3])
    return found


def test_a_replication_factor_above_the_brokers_is_refused_in_one_line(pipeline: Pipeline) -> None:
    worker = pipeline.start_worker("aggregator", WEIR_REPLICATION_FACTOR=2, WEIR_MIN_INSYNC_REPLICAS=2)
    assert worker.process is not None
    assert worker.process.wait(90) == 2, worker.log_text()[-3000:]
    log = worker.log_text()
    assert f"setting WEIR_REPLICATION_FACTOR=2: the cluster at {pipeline.bootstrap} has only 1 live broker(s) to create" in log
    assert "Traceback" not in log
    assert asyncio.run(topics_with_prefix(pipeline.bootstrap, pipeline.prefix)) == [], "refused before any topic is created"


def test_every_topic_a_worker_creates_carries_min_insync_replicas(pipeline: Pipeline) -> None:
    pipeline.start_worker("all", WEIR_MIN_INSYNC_REPLICAS=1).wait_ready()
    names = asyncio.run(topics_with_prefix(pipeline.bootstrap, pipeline.prefix))
    assert any(name.endswith("-changelog") for name in names), names
    assert any(name.endswith("item-results") for name in names), names
    found = asyncio.run(topic_settings(pipeline.bootstrap, names, "min.insync.replicas"))
    assert found == dict.fromkeys(names, ("1", TOPIC_LEVEL)), f"set on each topic, not the broker default: {found}"


def test_a_topic_the_broker_refuses_is_an_error_not_an_auto_created_default(pipeline: Pipeline) -> None:
    """Once, a topic named twice in one request was refused and the broker's auto-creation (on the next metadata
    request) made it with its own defaults; a refusal now ends the call, and the topic is not made."""
    name = pipeline.topic("bad-policy")
    with pytest.raises(RuntimeError, match=rf"refused to create {re.escape(name)}: error 40"):  # INVALID_CONFIG
        asyncio.run(ensure_topics(pipeline.bootstrap, [name], 2, config={"cleanup.policy": "keep-forever"}))
    with pytest.raises(SettingError, match="has only 1 live broker"):  # asked only when a topic is to be created
        asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic("three-copies")], 2, replication=3))
    assert asyncio.run(topics_with_prefix(pipeline.bootstrap, pipeline.prefix)) == []
    twice = [pipeline.topic("a"), pipeline.topic("b"), pipeline.topic("a")]
    assert asyncio.run(ensure_topics(pipeline.bootstrap, twice, 2, config={"min.insync.replicas": "1"})) == dict.fromkeys(twice, 2)
    found = asyncio.run(topic_settings(pipeline.bootstrap, sorted(set(twice)), "min.insync.replicas"))
    assert found == dict.fromkeys(set(twice), ("1", TOPIC_LEVEL))
