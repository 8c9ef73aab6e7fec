"""The shop's day with its broker SIGKILLed twice mid-run and restarted on the same data directory (issue 37).

Tried by hand on an earlier main: workers were fenced (ProducerFenced) and exited, every screen ended without a
report, scoops stayed reserved and payments stayed captured. A worker whose open transaction the broker aborted
(the outage outlasted the transaction timeout) still stops itself, as it must (its store holds writes that will
never commit), and the supervisor the demo uses restarts it in its slot. Here every line must get exactly one
outcome, the money and the stock must balance, the reports must equal the sequential reference, and every worker
must be running at the end.

Runs on a private broker instance (own ports and state dir): the shared broker is never stopped.
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

from shop.demo import run_shop
from tests.integration.conftest import Pipeline
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

ORDERS_PER_SCREEN = 40
BROKER_KILLS = 2
DOWNTIME_S = 8.0


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[BrokerInstance]:
    broker = BrokerInstance(tmp_path / "broker").start()
    try:
        yield broker
    finally:
        broker.stop()


def test_the_shop_keeps_its_books_when_the_broker_is_sigkilled_twice_mid_day(own_broker: BrokerInstance, tmp_path: Path) -> None:
    unique = uuid.uuid4().hex[:8]
    pipeline = Pipeline(bootstrap=own_broker.bootstrap, tmp=tmp_path, prefix=f"k{unique}.", app_id=f"k{unique}")
    screens = make_screens(int(os.environ.get("SHOP_FAULT_ORDERS", str(3 * ORDERS_PER_SCREEN))) // 3, seed=11)
    total = sum(len(lines) for lines in screens.values())
    # no order may time out at a barrier, nor the day be abandoned, while the broker is away
    env = {"WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000, "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000}
    killed_at_ms: list[int] = []
    failures: list[BaseException] = []

    def outcomes_out() -> int:
        try:
            return len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("shop.outcomes"))))
        except Exception:  # the broker is still coming back
            return -1

    def chaos() -> None:
        try:
            for kill in range(BROKER_KILLS):
                # the first kill at about a third of the day, the second at about two thirds
                due = total * (kill + 1) // (BROKER_KILLS + 1)
                deadline = time.monotonic() + 240
                while outcomes_out() < due:
                    assert time.monotonic() < deadline, f"only {outcomes_out()} of {due} outcomes before kill {kill + 1}"
                    time.sleep(0.2)
                killed_at_ms.append(int(time.time() * 1000))
                own_broker.kill()
                time.sleep(DOWNTIME_S)
                own_broker.start()
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
                killer.join(300)
        elapsed = time.monotonic() - started
        print(
            f"\n{total} orders, the broker SIGKILLed {len(killed_at_ms)} times for {DOWNTIME_S:.0f}s each, in {elapsed:.1f}s; "
            f"workers restarted: {supervisor.restarts}"
        )
        assert not failures, failures
        assert len(killed_at_ms) == BROKER_KILLS
        assert supervisor.refused == []
        stopped = [worker.log_path.name for worker in workers if worker.process is None or worker.process.poll() is not None]
        assert stopped == [], f"workers not running at the end: {stopped}"
        assert_outcomes_once_on_the_topic(pipeline, screens, killed_at_ms)
        assert_invariants(result, screens)
        assert comparable(result["reports"]) == reference_reports(screens)
    finally:
        pipeline.stop_all()
