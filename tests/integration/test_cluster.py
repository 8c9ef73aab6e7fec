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
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from shop.demo import run_shop
from tests.integration.conftest import Pipeline
from tests.integration.local_broker import ClusterInstance
from tests.integration.test_shop import (
    assert_invariants,
    assert_outcomes_once_on_the_topic,
    comparable,
    make_screens,
    reference_reports,
    start_shop,
)
from weir.app.kafka_io import read_to_end
from weir.app.processes import Supervisor

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


async def under_replicated(bootstrap: str) -> list[str]:
    """The partitions (every topic's, Kafka's own included) whose in-sync replicas are fewer than their replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(await admin.list_topics())
    finally:
        await admin.close()
    return [
        f"{topic['topic']}-{partition['partition']}"
        for topic in described
        for partition in topic.get("partitions", [])
        if len(partition["isr"]) < len(partition["replicas"])
    ]


def test_the_shop_keeps_its_books_while_each_of_three_brokers_is_sigkilled_in_turn(cluster: ClusterInstance, tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:8]
    pipeline = Pipeline(bootstrap=cluster.bootstrap, tmp=tmp_path, prefix=f"c{unique}.", app_id=f"c{unique}")
    screens = make_screens(int(os.environ.get("SHOP_CLUSTER_ORDERS", "90")) // 3, seed=13)
    total = sum(len(lines) for lines in screens.values())
    env = {
        "WEIR_REPLICATION_FACTOR": 3,
        "WEIR_MIN_INSYNC_REPLICAS": 2,
        "WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000,  # no order times out at a barrier while a leader moves
        "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000,
    }
    killed: list[int] = []
    killed_at_ms: list[int] = []
    failures: list[BaseException] = []

    def outcomes_out() -> int:
        try:
            return len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("shop.outcomes"))))
        except Exception:  # a leader is moving
            return -1

    def chaos() -> None:
        try:
            first = cluster.active_controller()
            order = [first] + [node for node in range(1, cluster.nodes + 1) if node != first]
            for turn, node in enumerate(order):
                due = total * (turn + 1) // (len(order) + 1)
                deadline = time.monotonic() + 240
                while outcomes_out() < due:
                    assert time.monotonic() < deadline, f"only {outcomes_out()} of {due} outcomes before node {node}'s kill"
                    time.sleep(0.2)
                killed_at_ms.append(int(time.time() * 1000))
                cluster.kill_node(node)
                killed.append(node)
                time.sleep(DOWNTIME_S)
                cluster.start_node(node)
                deadline = time.monotonic() + 120
                while lagging := asyncio.run(under_replicated(pipeline.bootstrap)):
                    assert time.monotonic() < deadline, f"node {node} not back in the in-sync replicas of {lagging[:5]}"
                    time.sleep(0.5)
        except BaseException as error:
            failures.append(error)

    try:
        workers = [worker for group in start_shop(pipeline, **env).values() for worker in group]
        killer = threading.Thread(target=chaos, daemon=True)
        started = time.monotonic()
        with Supervisor(workers) as supervisor:
            killer.start()
            try:
                result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=300))
            finally:
                killer.join(400)
        elapsed = time.monotonic() - started
        print(
            f"\n{total} orders on 3 brokers, nodes SIGKILLed in turn {killed} (the active controller first) for {DOWNTIME_S:.0f}s "
            f"each, in {elapsed:.1f}s; workers restarted: {len(supervisor.restarts)} {supervisor.restarts}"
        )
        assert not failures, failures
        assert sorted(killed) == [1, 2, 3], "every node killed once"
        assert supervisor.refused == []
        stopped = [worker.log_path.name for worker in workers if worker.process is None or worker.process.poll() is not None]
        assert stopped == [], f"workers not running at the end: {stopped}"
        assert_outcomes_once_on_the_topic(pipeline, screens, killed_at_ms)
        assert_invariants(result, screens)
        assert comparable(result["reports"]) == reference_reports(screens)
    finally:
        pipeline.stop_all()
