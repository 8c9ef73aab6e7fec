"""The barrier end to end: real broker, real workers running the flows of tests/integration/barrier_flows.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.kafka_io import ensure_topics, read_topic
from app.processes import WorkerProcess
from tests.integration.conftest import Pipeline

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


def test_exchange_waits_for_both_flows_and_goes_on_as_it_arrived(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline).wait_ready()
    send(pipeline, "dispatch-in", [dispatch("o-1")])
    time.sleep(3)
    assert read_all(pipeline, "dispatched", expected=1, timeout_s=2) == [], "released before anything completed"
    send(pipeline, "kitchen", [kitchen("o-1")])
    time.sleep(3)
    assert read_all(pipeline, "dispatched", expected=1, timeout_s=2) == [], "released with payment still missing"
    send(pipeline, "payment", [payment("o-1")])
    [message] = read_all(pipeline, "dispatched", expected=1, timeout_s=30)
    body = orjson.loads(message.value)
    headers = {name: value.decode() for name, value in message.headers}
    assert body["order_id"] == "o-1"
    assert body["dispatched"] is True
    assert body["stamped_ms"] is not None, "the property set before the barrier is there after it"
    assert headers == {"trace": "t-o-1", "order-id": "o-1"}, "headers as they were on arrival at the barrier"
    runs = step_runs(pipeline)
    assert runs["stamp o-1"] == 1, "a step before the barrier never runs twice"
    assert runs["dispatch o-1"] == 1


def test_completions_before_arrival_are_remembered(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline).wait_ready()
    send(pipeline, "kitchen", [kitchen("o-2")])
    send(pipeline, "payment", [payment("o-2")])
    time.sleep(3)
    sent = time.time()
    send(pipeline, "dispatch-in", [dispatch("o-2")])
    [message] = read_all(pipeline, "dispatched", expected=1, timeout_s=30)
    assert orjson.loads(message.value)["order_id"] == "o-2"
    assert message.timestamp / 1000 - sent < 15.0, "released at once, not at the 30 s timeout"


def test_a_retried_failure_does_not_count_and_a_definitive_one_fails_the_waiting_exchange(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline).wait_ready()
    send(pipeline, "dispatch-in", [dispatch("retried"), dispatch("declined")])
    send(pipeline, "kitchen", [kitchen("retried"), kitchen("declined")])
    send(pipeline, "payment", [payment("retried", fail_times=2), payment("declined", fail=True)])
    [message] = read_all(pipeline, "dispatched", expected=1, timeout_s=30)
    assert orjson.loads(message.value)["order_id"] == "retried"
    letters = [orjson.loads(record.value) for record in read_all(pipeline, "dead-letters", expected=2, timeout_s=30)]
    by_flow = {(letter["agent"], letter["reason"]): letter for letter in letters}
    payment_letter = by_flow[("flow:payment", "failed")]
    assert payment_letter["attempts"] == 3
    assert "card declined for declined" in payment_letter["error"]
    waiting_letter = by_flow[("flow:dispatch", "awaited-failed")]
    assert waiting_letter["step"] == BARRIER
    assert "'payment' failed for key 'declined'" in waiting_letter["error"]
    time.sleep(2)
    assert len(read_all(pipeline, "dispatched", expected=2, timeout_s=2)) == 1


def test_timeout_dead_letters_names_what_was_awaited_tells_awaiting_flows_and_ignores_late_completions(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=4000).wait_ready()
    send(pipeline, "notify-in", [("late", {"order_id": "late"}, {"order-id": "late"})])
    send(pipeline, "dispatch-in", [dispatch("late")])
    send(pipeline, "kitchen", [kitchen("late")])
    letters = [orjson.loads(record.value) for record in read_all(pipeline, "dead-letters", expected=2, timeout_s=40)]
    reasons = {(letter["agent"], letter["reason"]): letter for letter in letters}
    timed_out = reasons[("flow:dispatch", "timeout")]
    assert timed_out["awaiting"] == [{"flow": "payment", "key": "late"}]
    assert "timed out still awaiting 'payment' (key 'late')" in timed_out["error"]
    told = reasons[("flow:notify", "awaited-failed")]
    assert "'dispatch' failed for key 'late'" in told["error"]
    send(pipeline, "payment", [payment("late")])
    time.sleep(4)
    assert read_all(pipeline, "dispatched", expected=1, timeout_s=2) == [], "a late completion releases nothing"
    assert read_all(pipeline, "notified", expected=1, timeout_s=1) == []


def copy_of_dispatch(order_id: str, copy: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A dispatch of ``order_id`` told apart from its other copies by the payload field ``copy``."""
    key, body, headers = dispatch(order_id)
    return (key, {**body, "copy": copy}, headers)


def test_a_second_waiter_on_a_key_is_dead_lettered_and_the_first_released_once(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline).wait_ready()  # the barrier's default rule: on_duplicate="reject"
    send(pipeline, "dispatch-in", [copy_of_dispatch("twice", 1), copy_of_dispatch("twice", 2)])
    [record] = read_all(pipeline, "dead-letters", expected=1, timeout_s=30)
    letter = orjson.loads(record.value)
    assert (letter["reason"], letter["agent"], letter["step"]) == ("duplicate-waiter", "flow:dispatch", BARRIER)
    assert "arrived for key 'twice' while exchange" in letter["error"]
    assert orjson.loads(letter["value"]["text"])["payload"]["copy"] == 2, "the dead letter carries the second exchange"
    send(pipeline, "kitchen", [kitchen("twice")])
    send(pipeline, "payment", [payment("twice")])
    [message] = read_all(pipeline, "dispatched", expected=1, timeout_s=30)
    assert orjson.loads(message.value)["copy"] == 1, "the first goes on, as it arrived"
    outcomes = [orjson.loads(row.value) for row in read_all(pipeline, "flow.dispatch.outcomes", expected=2, timeout_s=10)]
    assert sorted(outcome["outcome"] for outcome in outcomes) == ["completed", "failed"], "the refused execution ends failed"
    time.sleep(2)
    assert len(read_all(pipeline, "dispatched", expected=2, timeout_s=2)) == 1, "released once"
    assert len(read_all(pipeline, "dead-letters", expected=2, timeout_s=1)) == 1


def test_an_exchange_too_large_for_the_barrier_is_dead_lettered_and_fails_alone(pipeline: Pipeline) -> None:
    """Its arrival cannot be written (1.1 MB, over what a record may hold): a dead letter, a failed outcome, no crash."""
    prepare(pipeline)
    start_flows(pipeline).wait_ready()
    big = (*dispatch("big")[:1], {**dispatch("big")[1], "inflate": 1_100_000}, dispatch("big")[2])
    send(pipeline, "dispatch-in", [big, dispatch("small")])
    send(pipeline, "kitchen", [kitchen("big"), kitchen("small")])
    send(pipeline, "payment", [payment("big"), payment("small")])
    [message] = read_all(pipeline, "dispatched", expected=1, timeout_s=30)
    assert orjson.loads(message.value)["order_id"] == "small", "the other key goes on"
    [record] = read_all(pipeline, "dead-letters", expected=1, timeout_s=10)
    letter = orjson.loads(record.value)
    assert (letter["reason"], letter["agent"], letter["step"]) == ("undeliverable", "flow:dispatch", BARRIER)
    assert "more than a record may hold" in letter["error"]
    destination = {name: raw["text"] for name, raw in letter["headers"]}["weir-destination"]
    assert destination == pipeline.topic(f"barrier.{BARRIER}")
    outcomes = [orjson.loads(row.value) for row in read_all(pipeline, "flow.dispatch.outcomes", expected=2, timeout_s=10)]
    by_key = {outcome["keys"]["await-dispatch"]: outcome for outcome in outcomes}  # the key the notify barrier reads
    assert by_key["small"]["outcome"] == "completed"
    assert by_key["big"]["outcome"] == "failed"
    assert "more than a record may hold" in by_key["big"]["error"]
    time.sleep(2)
    assert len(read_all(pipeline, "dispatched", expected=2, timeout_s=2)) == 1, "the big exchange never passes the barrier"
    assert step_runs(pipeline)["stamp big"] == 1, "handled once: the worker did not crash and replay it"


def test_release_all_releases_every_waiter_on_a_key_together(pipeline: Pipeline) -> None:
    prepare(pipeline)
    start_flows(pipeline, TEST_BARRIER_ON_DUPLICATE="release-all").wait_ready()
    send(pipeline, "dispatch-in", [copy_of_dispatch("both", 1), copy_of_dispatch("both", 2)])
    send(pipeline, "kitchen", [kitchen("both")])
    send(pipeline, "payment", [payment("both")])
    messages = read_all(pipeline, "dispatched", expected=2, timeout_s=30)
    assert sorted(orjson.loads(message.value)["copy"] for message in messages) == [1, 2]
    assert read_all(pipeline, "dead-letters", expected=1, timeout_s=1) == []


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
    assert "Agent: app.serve.stage_barrier_" in awaiting.log_text(), "a barrier runs with the flow that owns it"
    assert "Agent: app.serve.stage_barrier_" not in awaited.log_text(), "and with no other"


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
    messages = read_all(pipeline, "dispatched", expected=len(waiting) + 1, timeout_s=3)
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
    messages = read_all(pipeline, "dispatched", expected=len(orders) + 1, timeout_s=3)
    counts = Counter(orjson.loads(message.value)["order_id"] for message in messages)
    assert counts == Counter(orders), f"lost: {sorted(set(orders) - set(counts))[:5]}, twice: {[k for k, v in counts.items() if v > 1][:5]}"


def test_a_hundred_thousand_exchanges_wait_on_one_worker_without_tasks(pipeline: Pipeline) -> None:
    """Waiting holds no task or thread: 100,000 exchanges wait at once, then a sample is released."""
    prepare(pipeline)
    worker = start_flows(pipeline, TEST_BARRIER_TIMEOUT_MS=3_600_000, TEST_STEP_LOG="")
    worker.wait_ready()
    total = 100_000
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
    sample = [f"h-{number}" for number in range(0, total, 2000)]
    send(pipeline, "kitchen", [kitchen(order_id) for order_id in sample])
    send(pipeline, "payment", [payment(order_id) for order_id in sample])
    messages = read_all(pipeline, "dispatched", expected=len(sample), timeout_s=300)
    assert sorted(orjson.loads(message.value)["order_id"] for message in messages) == sorted(sample)
