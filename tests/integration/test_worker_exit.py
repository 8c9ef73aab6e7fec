"""A worker that crashes exits (issue 37): its process ends with a non-zero code, so whatever runs it (a service
manager, compose's restart policy, weir's Supervisor) can restart it.

The crash here is the one a broker outage longer than the transaction timeout causes: another producer takes the
worker's transactional id (as the broker's abort of a timed-out transaction does, it bumps the epoch), and the
worker's next commit is refused as fenced. This stop is a clean one. After a real outage the stop itself can fail
(the consumer's thread stopped on a closed loop) and the process used to stay alive after "We experienced a crash":
the interpreter waits for every non-daemon thread at exit. That case is tested by the broker SIGKILL in
``test_broker_kill_shop.py``, where it happened, not here.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiokafka import AIOKafkaProducer

from tests.integration import test_split_aggregate as split
from tests.integration.conftest import Pipeline, exit_code, free_port
from weir.app.kafka_io import produce_json, read_to_end, read_topic

pytestmark = pytest.mark.integration


async def fence(bootstrap: str, transactional_id: str) -> None:
    """Start a producer with ``transactional_id``: the broker bumps its epoch and aborts its open transaction."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, enable_idempotence=True)
    await producer.start()
    await producer.stop()


def orders(first: int, count: int) -> list[tuple[str, dict[str, object]]]:
    return [(f"o-{number}", {"order_id": f"o-{number}", "items": [{"value": 1}]}) for number in range(first, first + count)]


def test_a_fenced_worker_exits_with_a_non_zero_code(pipeline: Pipeline) -> None:
    worker = pipeline.start_worker("all", WEIR_WORKER_ID="fenced-one")
    worker.wait_ready()
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), orders(0, 5)))
    results = asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic("aggregates"), until=lambda rows: len(rows) >= 5, timeout_s=60))
    assert len(results) == 5, "the worker committed before it was fenced"
    asyncio.run(fence(pipeline.bootstrap, f"{pipeline.app_id}-all-worker-fenced-one"))
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), orders(5, 5)))  # its next commit is refused
    code = exit_code(worker, 90, still="the fenced worker is still running 90 s later")
    log = worker.log_text()
    assert code != 0, log[-3000:]
    assert "ProducerFenced" in log or "producer fenced" in log, log[-3000:]


def test_workers_stopped_by_sigterm_mid_run_hand_over_without_losing_or_repeating_an_order(pipeline: Pipeline) -> None:
    """SIGTERM while a burst of orders is being processed, three times: each worker stops within the time a service
    manager gives it (it does not wait for the work left), with exit code 0, and the next one, started after it,
    goes on from what it committed. Every order completes once. (Faust's stop used to let the agents process the
    events already delivered after it had revoked the tables: their outputs were committed without their offsets,
    and the next worker sent them again, in about one stop in four of this kind.)"""
    split.create_topics(pipeline)
    orders = split.make_orders(900, seed=41, max_items=8, sleep_s=0.1)
    rounds = [dict(list(orders.items())[start : start + 300]) for start in range(0, 900, 300)]
    sent: dict[str, list[dict[str, object]]] = {}
    left_at_stop = []
    for number, batch in enumerate(rounds):
        worker = pipeline.start_worker("all")
        worker.wait_ready()
        done_at_start = len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates"))))
        sent |= batch
        # all at once, a second after the reader below has started (a new reader takes a moment to see the first
        # results, and by then a worker may have done the whole batch): the agents' inboxes are full at the SIGTERM
        sender = threading.Timer(1.0, split.send_orders, args=(pipeline, batch))
        sender.start()
        try:
            split.read_json(pipeline, "aggregates", expected=done_at_start + 20, timeout_s=60)
        finally:
            sender.join()
        started = time.monotonic()
        worker.terminate()
        code = exit_code(worker, 30, still=f"worker {number} still runs 30 s after SIGTERM")
        stopped_in_s = time.monotonic() - started
        log = worker.log_text()
        assert code == 0, log[-3000:]
        assert "Signal received: 15" in log, log[-3000:]
        left_at_stop.append(len(sent) - len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates")))))
        print(f"worker {number} stopped {stopped_in_s:.1f} s after SIGTERM, {left_at_stop[-1]} orders left to the next")
    assert all(left > 0 for left in left_at_stop), f"a SIGTERM came after the last order sent: {left_at_stop}"
    last = pipeline.start_worker("all")
    last.wait_ready()
    results = split.read_json(pipeline, "aggregates", expected=len(orders), timeout_s=120, settle_s=2)
    split.assert_complete_once(results, orders)


def test_a_worker_that_cannot_reach_its_broker_exits_in_one_line_to_be_started_again(pipeline: Pipeline) -> None:
    """No broker at the address: the worker cannot create its topics. It exits with code 1 (whatever runs it starts it
    again, and the broker may be back) and says why in one line, no traceback."""
    worker = pipeline.start_worker("all", KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    code = exit_code(worker, 60, still="the worker with no broker still runs 60 s later")
    log = worker.log_text()
    assert code == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("weir worker: could not create topics")]
    assert len(lines) == 1, log[-3000:]
    assert "Unable to bootstrap" in lines[0], lines[0]
    assert pipeline.topic("orders") in lines[0], lines[0]
