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

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Pipeline, free_port
from tests.integration.fault_proxy import FaultProxy
from tests.integration.local_broker import BrokerInstance
from tests.integration.shop_faults import Fault, run_day_with_faults
from tests.integration.test_shop import make_screens

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
