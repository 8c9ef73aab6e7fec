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

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Pipeline
from tests.integration.local_broker import BrokerInstance
from tests.integration.shop_faults import run_day_with_faults
from tests.integration.test_shop import make_screens

#: the broker-fault runs go one after another, beside the shop's group on the other test process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

ORDERS_PER_SCREEN = 30
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
    # no order may time out at a barrier, nor the day be abandoned, while the broker is away
    env = {"WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000, "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000}

    def outage() -> None:
        own_broker.kill()
        time.sleep(DOWNTIME_S)
        own_broker.start()

    # the first kill at about a third of the day, the second at about two thirds
    plan = [(f"broker SIGKILL {kill + 1} for {DOWNTIME_S:.0f}s", outage) for kill in range(BROKER_KILLS)]
    run_day_with_faults(pipeline, screens, env, plan)
