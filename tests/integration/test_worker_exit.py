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

import pytest
from aiokafka import AIOKafkaProducer

from tests.integration.conftest import Pipeline, exit_code
from weir.app.kafka_io import produce_json, read_topic

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
