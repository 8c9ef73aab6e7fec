"""The barrier end to end: real broker, real workers running the flows of tests/integration/barrier_flows.py.

Only what needs the broker: a restart, a SIGKILL, two processes, each flow in a process of its own, a graph or a
selection a worker refuses, a hundred thousand exchanges waiting on one worker. The barrier's behaviours (release,
remembered completions, retried and definitive failures, timeout, duplicate waiters, an arrival too large,
release-all) run on the test driver: tests/unit/driver/test_barrier_driver.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics, read_to_end, read_topic
from weir.app.processes import WorkerProcess

pytestmark = pytest.mark.integration

BARRIER = "await-kitchen-and-payment"
TOPICS = [
    "kitchen",
    "payment",
    "dispatch-in",
    "notify-in",
    "dispatched",
    "notified",
    "dead-letters",
    f"barrier.{BARRIER}",
    "barrier.await-dispatch",
    *[f"flow.{name}.{kind}" for name in ("kitchen", "payment", "dispatch", "notify") for kind in ("resume", "outcomes")],
]


def start_flows(pipeline: Pipeline, **overrides: Any) -> WorkerProcess:
    settings = {
        "WEIR_FLOWS": "tests.integration.barrier_flows",
        "TEST_STEP_LOG": str(pipeline.tmp / "steps.log"),
        "WEIR_RETRY_ATTEMPTS": 3,
        **overrides,
    }
    worker = pipeline.start_worker("flows", **settings)
    return worker


def prepare(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))


def send(pipeline: Pipeline, topic: str, records: list[tuple[str, dict[str, Any], dict[str, str]]]) -> None:
    """Send (key, payload, headers) records; headers ride as Kafka headers."""

    async def run() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=pipeline.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            for key, value, headers in records:
                encoded = [(name, text.encode()) for name, text in headers.items()]
                await producer.send(pipeline.topic(topic), key=key.encode(), value=orjson.dumps(value), headers=encoded)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(run())


def kitchen(order_id: str, **extra: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    return (order_id, {"order_id": order_id, **extra}, {"order-id": order_id})


def payment(order_id: str, **extra: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    return (order_id, {"order": {"id": order_id}, **extra}, {})


def dispatch(order_id: str) -> tuple[str, dict[str, Any], dict[str, str]]:
    # The payment await reads payload 'order.id', on the waiting exchange as on payment's own; the notify
    # flow's barrier reads header 'order-id' on entry to dispatch, before any step, so it comes with it.
    return (order_id, {"order_id": order_id, "order": {"id": order_id}, "items": 2}, {"trace": f"t-{order_id}", "order-id": order_id})


def read_all(pipeline: Pipeline, topic: str, *, expected: int, timeout_s: float) -> list[Any]:
    return asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(topic), until=lambda rows: len(rows) >= expected, timeout_s=timeout_s))


def step_runs(pipeline: Pipeline) -> Counter[str]:
    path = pipeline.tmp / "steps.log"
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def test_worker_refuses_a_graph_that_cannot_run(pipeline: Pipeline, tmp_path: Path) -> None:
    module = tmp_path / "cyclic_flows.py"
    module.write_text(
        "from app.flows import Flow, header\n"
        "FLOWS = [\n"
        "  Flow('a', source='ta').barrier('a-waits', correlate_by=header('k'), awaits=['tb'], timeout_ms=1000),\n"
        "  Flow('b', source='tb').barrier('b-waits', correlate_by=header('k'), awaits=['tc'], timeout_ms=1000),\n"
        "  Flow('c', source='tc').barrier('c-waits', correlate_by=header('k'), awaits=['ta'], timeout_ms=1000),\n"
        "]\n"
    )
    worker = pipeline.start_worker("flows", WEIR_FLOWS="cyclic_flows", PYTHONPATH=f"{tmp_path}:{Path(__file__).resolve().parents[2]}")
    assert worker.process is not None
    assert worker.process.wait(60) != 0
    assert "flows wait for each other in a cycle: a -> b -> c -> a" in worker.log_text()


def test_each_flow_can_run_in_processes_of_its_own(pipeline: Pipeline) -> None:
    prepare(pipeline)
    # The awaited flows in one process, the awaiting ones in another: each selection is its own group.
    awaited = start_flows(pipeline, WEIR_FLOWS_RUN="kitchen,payment")
    awaiting = start_flows(pipeline, WEIR_FLOWS_RUN="dispatch,notify")
    for worker in (awaited, awaiting):
        worker.wait_ready()
    send(pipeline, "dispatch-in", [dispatch(f"p-{n}") for n in range(5)])
    send(pipeline, "notify-in", [(f"p-{n}", {"notify": f"p-{n}"}, {"order-id": f"p-{n}"}) for n in range(5)])
    send(pipeline, "kitchen", [kitchen(f"p-{n}") for n in range(5)])
    send(pipeline, "payment", [payment(f"p-{n}") for n in range(5)])
    dispatched = read_all(pipeline, "dispatched", expected=5, timeout_s=60)
    assert sorted(orjson.loads(message.value)["order_id"] for message in dispatched) == [f"p-{n}" for n in range(5)]
    notified = read_all(pipeline, "notified", expected=5, timeout_s=30)
    assert len(notified) == 5, "the notify flow (with dispatch) was released by dispatch's outcomes"
    runs = step_runs(pipeline)
    assert all(runs[f"cook p-{n}"] == 1 and runs[f"dispatch p-{n}"] == 1 for n in range(5))
    assert f"{pipeline.app_id}-flows.kitchen.payment" in awaited.log_text()
    assert f"{pipeline.app_id}-flows.dispatch.notify" in awaiting.log_text()
    # Faust names an agent by its function (app.application.stage_<stage>), shortened in its log when long
    assert "stage_barrier_await_kitchen_and_payment]" in awaiting.log_text(), "a barrier runs with the flow that owns it"
    assert "stage_barrier_" not in awaited.log_text(), "and with no other"


def test_a_flow_selection_naming_an_unknown_flow_is_refused(pipeline: Pipeline) -> None:
    worker = start_flows(pipeline, WEIR_FLOWS_RUN="kitchen,nowhere")
    assert worker.process is not None
    assert worker.process.wait(60) != 0
    assert "WEIR_FLOWS_RUN names flow(s) ['nowhere']" in worker.log_text()


def test_restart_loses_nothing_and_resumes_what_ended_while_down(pipeline: Pipeline) -> None:
    prepare(pipeline)
    worker = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=30_000)
    worker.wait_ready()
    waiting = [f"r-{number}" for number in range(20)]
    send(pipeline, "dispatch-in", [dispatch(order_id) for order_id in waiting])
    send(pipeline, "kitchen", [kitchen(order_id) for order_id in waiting])
    # Everything waits for payment now; make sure the waits are durable, then stop every worker.
    time.sleep(6)
    worker.stop()
    restarted = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=30_000)
    restarted.wait_ready()
    send(pipeline, "payment", [payment(order_id) for order_id in waiting])
    messages = read_all(pipeline, "dispatched", expected=len(waiting), timeout_s=60)
    time.sleep(3)
    messages = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dispatched")))  # a second release would be there by now
    counts = Counter(orjson.loads(message.value)["order_id"] for message in messages)
    assert counts == Counter(waiting), f"each released exactly once: {counts}"
    runs = step_runs(pipeline)
    assert all(runs[f"stamp {order_id}"] == 1 for order_id in waiting), "steps before the barrier ran once"


def test_two_processes_and_a_sigkill_while_exchanges_wait(pipeline: Pipeline) -> None:
    prepare(pipeline)
    first = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=60_000)
    second = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=60_000)
    first.wait_ready()
    second.wait_ready()
    orders = [f"m-{number}" for number in range(200)]
    send(pipeline, "dispatch-in", [dispatch(order_id) for order_id in orders])
    send(pipeline, "kitchen", [kitchen(order_id) for order_id in orders])
    time.sleep(5)
    second.kill()
    send(pipeline, "payment", [payment(order_id) for order_id in orders])
    messages = read_all(pipeline, "dispatched", expected=len(orders), timeout_s=120)
    time.sleep(3)
    messages = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dispatched")))  # a second release would be there by now
    counts = Counter(orjson.loads(message.value)["order_id"] for message in messages)
    assert counts == Counter(orders), f"lost: {sorted(set(orders) - set(counts))[:5]}, twice: {[k for k, v in counts.items() if v > 1][:5]}"


def test_ten_thousand_exchanges_wait_on_one_worker_without_tasks(pipeline: Pipeline) -> None:
    """Waiting holds no task or thread: 10,000 exchanges wait at once (fifty times the tasks allowed), then a sample is
    released. The barrier at scale is measured by ``make bench`` (bench.barrier), not here."""
    prepare(pipeline)
    worker = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=3_600_000, TEST_STEP_LOG="")
    worker.wait_ready()
    total = 10_000
    send(pipeline, "dispatch-in", [dispatch(f"h-{number}") for number in range(total)])
    waiting: dict[bytes, bool] = {}
    seen: list[Any] = []

    def all_waiting(rows: list[Any]) -> bool:
        for row in rows[len(seen) :]:
            waiting[row.key] = bool(row.value) and b'"waiting":[{' in row.value
        seen[:] = rows
        return sum(waiting.values()) >= total

    changelog = pipeline.topic(f"barrier-{BARRIER}-changelog")
    asyncio.run(read_topic(pipeline.bootstrap, changelog, until=all_waiting, timeout_s=900))
    assert sum(waiting.values()) == total, f"only {sum(waiting.values())} of {total} exchanges are waiting in the table"
    assert worker.process is not None
    status = dict(line.split(":", 1) for line in Path(f"/proc/{worker.process.pid}/status").read_text().splitlines() if ":" in line)
    threads = int(status["Threads"].split()[0])
    worker.process.send_signal(signal.SIGUSR1)
    time.sleep(2)
    tasks = worker.log_text().split("asyncio tasks:")[-1].count("\n--- ")
    assert threads < 20, f"{threads} threads while {total} exchanges wait"
    assert 0 < tasks < 200, f"{tasks} asyncio tasks while {total} exchanges wait"
    sample = [f"h-{number}" for number in range(0, total, 200)]
    send(pipeline, "kitchen", [kitchen(order_id) for order_id in sample])
    send(pipeline, "payment", [payment(order_id) for order_id in sample])
    messages = read_all(pipeline, "dispatched", expected=len(sample), timeout_s=300)
    assert sorted(orjson.loads(message.value)["order_id"] for message in messages) == sorted(sample)
