"""A shop's day with faults injected while it runs, and its audit: what the broker-fault tests share
(``test_broker_kill_shop.py``, ``test_cluster.py``, ``test_network_faults.py``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shop.demo import run_shop
from tests.integration.conftest import Pipeline
from tests.integration.test_shop import (
    assert_invariants,
    assert_outcomes_once_on_the_topic,
    comparable,
    reference_reports,
    start_shop,
)
from weir.app.kafka_io import read_to_end
from weir.app.processes import Supervisor, WorkerProcess

#: A fault: its name, and what injects it (returns once the fault is over).
Fault = tuple[str, Callable[[], None]]


@dataclass
class FaultyDay:
    result: dict[str, Any]
    supervisor: Supervisor
    elapsed_s: float
    #: the faults injected, in order, and when each began
    injected: list[str] = field(default_factory=list)
    injected_at_ms: list[int] = field(default_factory=list)


#: How long after the day every worker must be running again (a restart in its slot takes a few seconds).
RUNNING_AGAIN_S = 30.0


def not_running(workers: list[WorkerProcess], *, within_s: float) -> list[str]:
    """The workers (their logs' names) still not running after waiting up to ``within_s`` for every one to be."""
    deadline = time.monotonic() + within_s
    while True:
        stopped = [worker.log_path.name for worker in workers if worker.process is None or worker.process.poll() is not None]
        if not stopped or time.monotonic() > deadline:
            return stopped
        time.sleep(0.5)


def run_day_with_faults(
    workers_side: Pipeline, screens: dict[str, list[str]], env: dict[str, Any], plan: list[Fault], *, audit: Pipeline | None = None
) -> FaultyDay:
    """Start the shop's workers on ``workers_side`` under a :class:`Supervisor`, serve ``screens`` through ``audit``'s
    bootstrap (default: the workers'), inject each fault of ``plan`` once an even share of the outcomes still due when
    the fault before it ended are out (the first at 1 / (len(plan) + 1) of the day), then audit the day: every fault
    injected while work was in flight, no worker refused or stopped, every line one outcome on the read_committed
    topic and none twice, payments and stock balanced, reports equal to the sequential reference. The workers are
    stopped at the end, whatever happened."""
    audit = audit or workers_side
    total = sum(len(lines) for lines in screens.values())
    failures: list[BaseException] = []
    day_started = time.monotonic()
    day = FaultyDay(result={}, supervisor=Supervisor([]), elapsed_s=0.0)

    def outcomes_out() -> int:
        try:
            return len(asyncio.run(read_to_end(audit.bootstrap, audit.topic("shop.outcomes"))))
        except Exception:  # the broker is still coming back
            return -1

    def chaos() -> None:
        try:
            for turn, (name, inject) in enumerate(plan):
                # a share of what is left once the fault before ended (a fault lasts seconds, and the day goes on
                # through it: fixed shares of the day, 90 orders on three screens were all out before the third fault)
                out = max(outcomes_out(), 0)
                due = out + (total - out) // (len(plan) - turn + 1)
                deadline = time.monotonic() + 240
                while outcomes_out() < due:
                    assert time.monotonic() < deadline, f"only {outcomes_out()} of {due} outcomes before the {name}"
                    time.sleep(0.2)
                day.injected_at_ms.append(int(time.time() * 1000))
                inject()
                day.injected.append(name)
        except BaseException as error:
            failures.append(error)

    try:
        workers = [worker for group in start_shop(workers_side, **env).values() for worker in group]
        killer = threading.Thread(target=chaos, daemon=True)
        day_started = time.monotonic()
        with Supervisor(workers) as day.supervisor:
            killer.start()
            try:
                day.result = asyncio.run(run_shop(screens, bootstrap=audit.bootstrap, topic_prefix=audit.prefix, timeout_s=300))
            finally:
                killer.join(400)
            day.elapsed_s = time.monotonic() - day_started
            # A zombie can learn that it was fenced after the day's last outcome (a partition healed late): it stops
            # itself and the Supervisor restarts it. Every worker must be running again soon, not at this very instant.
            stopped = not_running(workers, within_s=RUNNING_AGAIN_S)
        print(f"\n{total} orders, faults {day.injected}, in {day.elapsed_s:.1f}s; workers restarted: {day.supervisor.restarts}")
        assert not failures, failures
        assert day.injected == [name for name, _ in plan], "every fault injected"
        assert day.supervisor.refused == []
        assert stopped == [], f"workers not running {RUNNING_AGAIN_S:.0f} s after the day: {stopped}"
        assert_outcomes_once_on_the_topic(audit, screens, day.injected_at_ms)
        assert_invariants(day.result, screens)
        assert comparable(day.result["reports"]) == reference_reports(screens)
        # reached only once every check above held
        print(f"audit: {total} lines, {total} outcomes, each once on the read_committed topic: 0 lost / 0 twice / 0 violations")
    finally:
        workers_side.stop_all()
    return day
