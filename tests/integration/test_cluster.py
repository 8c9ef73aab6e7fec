"""The shop on a three-broker cluster while each broker is SIGKILLed and restarted in turn (issue 37).

Replication 3 and ``min.insync.replicas`` 2 for every topic weir creates (``WEIR_REPLICATION_FACTOR``,
``WEIR_MIN_INSYNC_REPLICAS``) and for Kafka's own offsets and transaction logs (scripts/broker.sh with
``WEIR_KAFKA_NODES=3``). The active controller goes first, then the two others, one at a time: every node is
killed once, so every partition leader, group coordinator and transaction coordinator of the run is killed at
some point. Before each kill the restarted node is back in every partition's in-sync replicas (else a second loss
would leave fewer than two copies and writes would wait). Audited like the SIGKILL chaos: every line one outcome,
none twice, payments and stock balanced, reports equal to the sequential reference, every worker running at the end
(a worker that stops itself, its transaction aborted by a coordinator's move, is restarted by the Supervisor).

A short form for ``make test``; a longer run with more orders: ``SHOP_CLUSTER_ORDERS=600``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.conftest import Pipeline
from tests.integration.local_broker import ClusterInstance
from tests.integration.shop_faults import run_day_with_faults
from tests.integration.test_shop import make_screens

#: the broker-fault runs go one after another (three JVMs and the shop's seven workers load the 2 cores), beside the
#: shop's group on the other test process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

DOWNTIME_S = 5.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterInstance]:
    instance = ClusterInstance(tmp_path / "cluster").start()
    try:
        yield instance
    finally:
        instance.kill()


async def describe_every_topic(bootstrap: str) -> list[dict[str, Any]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return cast(list[dict[str, Any]], await admin.describe_topics(await admin.list_topics()))
    finally:
        await admin.close()


async def under_replicated(bootstrap: str) -> list[str]:
    """The partitions (every topic's, Kafka's own included) whose in-sync replicas are fewer than their replicas."""
    return [
        f"{topic['topic']}-{partition['partition']}"
        for topic in await describe_every_topic(bootstrap)
        for partition in topic.get("partitions", [])
        if len(partition["isr"]) < len(partition["replicas"])
    ]


def replicas_by_topic(bootstrap: str, prefix: str) -> dict[str, set[int]]:
    """The numbers of replicas of the partitions of each topic named ``prefix...`` (weir's, changelogs included)."""
    described = asyncio.run(describe_every_topic(bootstrap))
    return {
        topic["topic"]: {len(partition["replicas"]) for partition in topic.get("partitions", [])}
        for topic in described
        if topic["topic"].startswith(prefix)
    }


def test_the_shop_keeps_its_books_while_each_of_three_brokers_is_sigkilled_in_turn(cluster: ClusterInstance, tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:8]
    pipeline = Pipeline(bootstrap=cluster.bootstrap, tmp=tmp_path, prefix=f"c{unique}.", app_id=f"c{unique}")
    screens = make_screens(int(os.environ.get("SHOP_CLUSTER_ORDERS", "90")) // 3, seed=13)
    env = {
        "WEIR_REPLICATION_FACTOR": 3,
        "WEIR_MIN_INSYNC_REPLICAS": 2,
        "WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000,  # no order times out at a barrier while a leader moves
        "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000,
    }

    def outage(node: int) -> None:
        cluster.kill_node(node)
        time.sleep(DOWNTIME_S)
        cluster.start_node(node)
        deadline = time.monotonic() + 120
        while lagging := asyncio.run(under_replicated(pipeline.bootstrap)):
            assert time.monotonic() < deadline, f"node {node} not back in the in-sync replicas of {lagging[:5]}"
            time.sleep(0.5)

    first = cluster.active_controller()
    order = [first] + [node for node in range(1, cluster.nodes + 1) if node != first]
    plan = [(f"node {node} SIGKILL for {DOWNTIME_S:.0f}s", functools.partial(outage, node)) for node in order]
    run_day_with_faults(pipeline, screens, env, plan)
    # every topic the shop's workers created, the tables' changelogs included, has its 3 copies
    replicas = replicas_by_topic(pipeline.bootstrap, pipeline.prefix)
    assert any(topic.endswith("-changelog") for topic in replicas), sorted(replicas)
    assert {topic: counts for topic, counts in replicas.items() if counts != {3}} == {}
