"""The shop's day while the network between its workers and the broker misbehaves (issue 37): added latency, every
connection cut (twice), and a partition longer than the session and transaction timeouts, then healed. And one worker
of two partitioned alone, behind a proxy of its own, while its peer goes on.

The workers reach the broker through a fault proxy (the broker advertises the proxy's port on a listener of its
own); the screens and the audit use the broker's own port, so only the workers see the faults. A worker cut off
past its session timeout is a zombie when the network heals: its group has moved on and the broker has aborted
its transaction, so it must commit nothing a read_committed reader sees (it stops itself, and the Supervisor
restarts it). Audited like the SIGKILL chaos: every line one outcome, none twice, payments and stock balanced,
reports equal to the sequential reference, every worker running at the end.

A short form for ``make test``; a longer run with more orders: ``SHOP_FAULT_ORDERS=600``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import test_split_aggregate as split
from tests.integration.conftest import Pipeline, free_port
from tests.integration.fault_proxy import FaultProxy
from tests.integration.local_broker import BrokerInstance
from tests.integration.shop_faults import Fault, run_day_with_faults
from tests.integration.test_shop import make_screens
from weir.app.kafka_io import read_to_end
from weir.app.processes import Supervisor

#: the broker-fault runs go one after another, beside the shop's group on the other test process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

PARTITION_S = 16.0  # longer than the test deployment's session timeout (6 s) and than the transaction timeout (10 s)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[BrokerInstance, FaultProxy]]:
    proxy_port, proxied_port = free_port(), free_port()
    broker = BrokerInstance(
        tmp_path / "broker", extra_env={"WEIR_KAFKA_PROXY_PORT": str(proxy_port), "WEIR_KAFKA_PROXIED_PORT": str(proxied_port)}
    )
    broker.start()
    proxy = FaultProxy(proxy_port, proxied_port).start()
    try:
        yield broker, proxy
    finally:
        proxy.stop()
        broker.stop()


def test_the_shop_keeps_its_books_through_latency_cut_connections_and_a_partition(
    proxied: tuple[BrokerInstance, FaultProxy], tmp_path: Path
) -> None:
    broker, proxy = proxied
    unique = uuid.uuid4().hex[:8]
    workers_side = Pipeline(bootstrap=f"127.0.0.1:{proxy.listen_port}", tmp=tmp_path, prefix=f"n{unique}.", app_id=f"n{unique}")
    direct = dataclasses.replace(workers_side, bootstrap=broker.bootstrap, workers=[])
    # 150: with 90, every line had its outcome before the partition began (the day goes on through a fault)
    screens = make_screens(int(os.environ.get("SHOP_FAULT_ORDERS", "150")) // 3, seed=17)
    env = {"WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000, "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000}

    def latency() -> None:
        proxy.latency_ms = 100.0
        time.sleep(8.0)
        proxy.latency_ms = 0.0

    def cuts() -> None:
        proxy.cut()
        time.sleep(3.0)
        proxy.cut()

    def partition() -> None:
        proxy.partition()
        time.sleep(PARTITION_S)
        proxy.heal()

    plan: list[Fault] = [
        ("latency 100 ms", latency),
        ("connections cut twice", cuts),
        (f"partition {PARTITION_S:.0f}s", partition),
    ]
    run_day_with_faults(workers_side, screens, env, plan, audit=direct)
    print(f"through the fault proxy: {proxy.accepted} connections, {proxy.cuts} cuts")


@pytest.fixture
def two_listeners(tmp_path: Path) -> Iterator[tuple[BrokerInstance, FaultProxy, FaultProxy]]:
    """A broker with a proxied listener per worker (scripts/broker.sh's port lists), each behind a fault proxy."""
    proxies, proxied = [free_port(), free_port()], [free_port(), free_port()]
    broker = BrokerInstance(
        tmp_path / "broker",
        extra_env={"WEIR_KAFKA_PROXY_PORT": ",".join(map(str, proxies)), "WEIR_KAFKA_PROXIED_PORT": ",".join(map(str, proxied))},
    )
    broker.start()
    first, second = (FaultProxy(listen, target).start() for listen, target in zip(proxies, proxied, strict=True))
    try:
        yield broker, first, second
    finally:
        first.stop()
        second.stop()
        broker.stop()


def test_one_worker_partitioned_alone_past_its_timeouts_loses_nothing_and_commits_nothing_twice(
    two_listeners: tuple[BrokerInstance, FaultProxy, FaultProxy], tmp_path: Path
) -> None:
    """Two workers of the split/aggregate pipeline (every agent each), each reaching the broker through a proxy of its
    own; the second is cut off alone for longer than the session and transaction timeouts while orders flow. Its peer
    takes its partitions (and restores their tables) and goes on; the broker aborts the zombie's open transaction, and
    when the network heals the zombie commits nothing a read_committed reader sees: it stops and is restarted in its
    slot. Every order completes once, with every item, and every item message and outcome is committed once."""
    broker, first_proxy, second_proxy = two_listeners
    unique = uuid.uuid4().hex[:8]
    pipeline = Pipeline(bootstrap=broker.bootstrap, tmp=tmp_path, prefix=f"p{unique}.", app_id=f"p{unique}")
    split.create_topics(pipeline)
    # items of 20 ms, one at a time: about 45 s of item work, so that the partition comes mid-run; more orders after the heal
    orders = split.make_orders(400, seed=29, max_items=10, sleep_s=0.02)
    first_part = dict(list(orders.items())[:320])
    second_part = dict(list(orders.items())[320:])
    settings = {"WEIR_AGGREGATE_TIMEOUT_MS": 300_000, "WEIR_ITEM_CONCURRENCY": 1}  # one item at a time per worker
    first = pipeline.start_worker("all", KAFKA_BOOTSTRAP=f"127.0.0.1:{first_proxy.listen_port}", **settings)
    second = pipeline.start_worker("all", KAFKA_BOOTSTRAP=f"127.0.0.1:{second_proxy.listen_port}", **settings)
    first.wait_ready()
    second.wait_ready()
    supervisor = Supervisor([first, second]).start()
    try:
        split.send_orders(pipeline, first_part)
        before = split.read_json(pipeline, "aggregates", expected=60, timeout_s=120)
        second_proxy.partition()
        time.sleep(PARTITION_S)
        during = len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates"))))  # what is there now
        second_proxy.heal()
        split.send_orders(pipeline, second_part)  # the healed worker (or its restart) takes part again
        results = split.read_json(pipeline, "aggregates", expected=len(orders), timeout_s=300, settle_s=3)
    finally:
        supervisor.stop()
        pipeline.stop_all()
    assert len(before) < during < len(first_part), f"the peer went on while the second worker was cut off ({during})"
    split.assert_complete_once(results, orders)
    split.assert_committed_once_below_the_results(pipeline, orders)
    print(
        f"one worker cut off {PARTITION_S:.0f}s: {len(before)} results before, {during} by the heal, {len(results)} at the end; "
        f"restarts {supervisor.restarts}; connections through its proxy {second_proxy.accepted}"
    )
