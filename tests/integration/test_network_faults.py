"""The shop's day while the network between its workers and the broker misbehaves (issue 37): added latency, every
connection cut (twice), and a partition longer than the session and transaction timeouts, then healed.

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
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shop.demo import run_shop
from tests.integration.conftest import Pipeline, free_port
from tests.integration.fault_proxy import FaultProxy
from tests.integration.local_broker import BrokerInstance
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
    screens = make_screens(int(os.environ.get("SHOP_FAULT_ORDERS", "120")) // 3, seed=17)
    total = sum(len(lines) for lines in screens.values())
    env = {"WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000, "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000}
    faults: list[str] = []
    faulted_at_ms: list[int] = []
    failures: list[BaseException] = []

    def outcomes_out() -> int:
        return len(asyncio.run(read_to_end(direct.bootstrap, direct.topic("shop.outcomes"))))

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

    plan: list[tuple[str, Callable[[], None]]] = [
        ("latency 100 ms", latency),
        ("connections cut twice", cuts),
        (f"partition {PARTITION_S:.0f}s", partition),
    ]

    def chaos() -> None:
        try:
            for turn, (name, fault) in enumerate(plan):
                due = total * (turn + 1) // (len(plan) + 1)
                deadline = time.monotonic() + 240
                while outcomes_out() < due:
                    assert time.monotonic() < deadline, f"only {outcomes_out()} of {due} outcomes before the {name}"
                    time.sleep(0.2)
                faulted_at_ms.append(int(time.time() * 1000))
                fault()
                faults.append(name)
        except BaseException as error:
            failures.append(error)

    try:
        workers = [worker for group in start_shop(workers_side, **env).values() for worker in group]
        killer = threading.Thread(target=chaos, daemon=True)
        started = time.monotonic()
        with Supervisor(workers) as supervisor:
            killer.start()
            try:
                result = asyncio.run(run_shop(screens, bootstrap=direct.bootstrap, topic_prefix=direct.prefix, timeout_s=300))
            finally:
                killer.join(300)
        elapsed = time.monotonic() - started
        print(
            f"\n{total} orders through the fault proxy, faults {faults}, {proxy.accepted} connections, {proxy.cuts} cuts, "
            f"in {elapsed:.1f}s; "
            f"workers restarted: {len(supervisor.restarts)} {supervisor.restarts}"
        )
        assert not failures, failures
        assert len(faults) == len(plan)
        assert supervisor.refused == []
        stopped = [worker.log_path.name for worker in workers if worker.process is None or worker.process.poll() is not None]
        assert stopped == [], f"workers not running at the end: {stopped}"
        assert_outcomes_once_on_the_topic(direct, screens, faulted_at_ms)
        assert_invariants(result, screens)
        assert comparable(result["reports"]) == reference_reports(screens)
    finally:
        workers_side.stop_all()
