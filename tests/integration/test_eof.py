"""End-of-stream per client end to end: gateway, parallel filter processes, controller, group-by/aggregate, joiner, cleanup.

Only what needs the broker: a SIGKILL of the controller, the joiner and a filter mid-run. The pattern's behaviours
(many clients at once, exact reports, the cleanup of every stage, an idle client, duplicated messages at every stage, a
job of one's own) run on the test driver with this module's clients and checks: tests/unit/driver/test_eof_behaviour.py."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from examples.eof_orders import JOB_SETTING, ORDERS
from shop.catalogue import CATALOGUE_CENTS
from tests.integration.conftest import Pipeline
from weir.app.eof_gateway import Gateway, batched
from weir.app.kafka_io import read_to_end, read_topic
from weir.tables.eof import TOPIC_COUNTER, TOPIC_REPORTS, EofJob, filter_batch, reference_report

pytestmark = pytest.mark.integration

BATCH_SIZE = 5
MAX_BATCH_ORDERS = 3  # the filter splits batches with more valid orders than this
FLAVOURS = sorted(CATALOGUE_CENTS)
#: Every stage's table that keeps state per client: the cleanup broadcast must reach each of them.
CLIENT_TABLES = ("eof_counters", "eof_totals", "eof_joins")
#: A client's own price list, without one flavour it sells (that flavour is reported unpriced).
SHOP_PRICES = {flavour: 100 + 10 * number for number, flavour in enumerate(FLAVOURS[1:])}


def client_lines(rng: random.Random, client: str, batches: int, drop_rate: float) -> list[str]:
    lines = []
    for number in range(batches * BATCH_SIZE - rng.randint(0, BATCH_SIZE - 1)):
        order_id = f"{client}-{number}"
        if rng.random() < drop_rate:
            lines.append(
                rng.choice(
                    [
                        '{"order_id": "broken',
                        json.dumps({"order_id": order_id, "time": "12:00", "items": [{"flavour": "durian", "scoops": 1}]}),
                        json.dumps({"order_id": order_id, "time": "12:00", "items": [{"flavour": "mint", "scoops": 0}]}),
                        json.dumps({"order_id": order_id, "time": "23:30", "items": [{"flavour": "mint", "scoops": 1}]}),
                    ]
                )
            )
        else:
            items = [{"flavour": rng.choice(FLAVOURS), "scoops": rng.randint(1, 3)} for _ in range(rng.randint(1, 3))]
            lines.append(json.dumps({"order_id": order_id, "time": f"{rng.randint(10, 21):02d}:{rng.randint(0, 59):02d}", "items": items}))
    return lines


def make_clients(seed: int, count: int) -> dict[str, list[str]]:
    """``count`` clients with 1 to 200 batches and their own drop rate; the first drops everything."""
    rng = random.Random(seed)
    clients = {}
    for number in range(count):
        client = f"screen-{number}"
        drop_rate = 1.0 if number == 0 else rng.choice([0.0, 0.05, 0.3, 0.7])
        batches = 200 if number == 1 else 1 if number == 2 else rng.randint(1, 200)
        clients[client] = client_lines(rng, client, batches, drop_rate)
    return clients


def start_eof_workers(pipeline: Pipeline, **env: Any) -> dict[str, Any]:
    common = {"WEIR_EOF_JOB": JOB_SETTING, "WEIR_EOF_MAX_BATCH_ORDERS": MAX_BATCH_ORDERS, "WEIR_EOF_CLOSED_RETENTION_MS": 2000, **env}
    workers = {
        "filter-a": pipeline.start_worker("eof_filter", **common),
        "filter-b": pipeline.start_worker("eof_filter", **common),
        "controller": pipeline.start_worker("eof_controller", **common),
        "aggregator": pipeline.start_worker("eof_aggregator", **common),
        "joiner": pipeline.start_worker("eof_joiner", **common),
    }
    for worker in workers.values():
        worker.wait_ready()
    return workers


def assert_reports_exact(
    reports: dict[str, dict[str, Any]], clients: dict[str, list[str]], side: dict[str, Any] | None = None, job: EofJob = ORDERS
) -> None:
    wrong = {}
    for client, lines in clients.items():
        report = dict(reports[client])
        report.pop("batches", None)
        expected = reference_report(client, lines, job, (side or {}).get(client))
        if report != expected:
            wrong[client] = (report, expected)
    assert not wrong, f"{len(wrong)} reports differ from the sequential reference, e.g. {next(iter(wrong.items()))}"


def last_values(pipeline: Pipeline, table: str) -> dict[str, Any]:
    """Each key's latest value in a table's changelog (None: deleted)."""
    records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(f"{table}-changelog")))
    return {orjson.loads(record.key): (orjson.loads(record.value) if record.value is not None else None) for record in records}


#: What a stage's value holds of a client besides the bookkeeping a tombstone keeps (client, times, closed).
CLIENT_DATA = {
    "eof_counters": ("sent_total", "reported", "finish_sent"),
    "eof_totals": ("seen", "records", "totals", "expected", "flushed"),
    "eof_joins": ("has_side", "side", "totals", "reported"),
}


def assert_cleaned_up(pipeline: Pipeline, timeout_s: float = 30.0) -> None:
    """No table keeps a finished client's keys once the tombstones' retention passed."""
    deadline = time.monotonic() + timeout_s
    left: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        left = {table: [key for key, value in last_values(pipeline, table).items() if value is not None] for table in CLIENT_TABLES}
        if not any(left.values()):
            return
        time.sleep(1.0)
    raise AssertionError(f"client keys still in the tables after {timeout_s}s: {left}")


def client_totals(lines: list[str]) -> dict[str, Any]:
    """The totals the group-by/aggregate stage flushes for a client's lines (what the joiner receives)."""
    forwarded = [
        chunk
        for number, batch in enumerate(batched(lines, BATCH_SIZE))
        for chunk in filter_batch(number, batch, ORDERS, MAX_BATCH_ORDERS).forwarded
    ]
    totals = ORDERS.zero()
    for _, orders in forwarded:
        for order in orders:
            totals = ORDERS.merge(totals, order)
    return {"batches": len(forwarded), "records": sum(len(orders) for _, orders in forwarded), "totals": totals, "error": None}


def test_sigkill_of_controller_joiner_and_a_filter_mid_run_keeps_every_report_exact(pipeline: Pipeline) -> None:
    clients = make_clients(seed=11, count=12)
    workers = start_eof_workers(pipeline, WEIR_EOF_IDLE_TIMEOUT_MS=60_000)

    async def scenario() -> dict[str, dict[str, Any]]:
        async with Gateway(pipeline.bootstrap, pipeline.topic) as gateway:
            runs = [
                asyncio.create_task(gateway.run_client(client, lines, batch_size=BATCH_SIZE, timeout_s=240))
                for client, lines in clients.items()
            ]
            # The kill comes once the filters have reported a few batches: work is in flight, few reports are out.
            await read_topic(
                pipeline.bootstrap,
                pipeline.topic(TOPIC_COUNTER),
                until=lambda rows: sum(b'"filtered"' in (row.value or b"") for row in rows) >= 3,
                timeout_s=60,
            )
            workers["controller"].kill()
            workers["filter-a"].kill()
            workers["joiner"].kill()
            killed_at_ms.append(int(time.time() * 1000))
            print("\nSIGKILLed the controller, the joiner and filter-a mid-run")
            await asyncio.sleep(1.0)
            for agents in ("eof_controller", "eof_joiner"):
                pipeline.start_worker(
                    agents,
                    WEIR_EOF_JOB=JOB_SETTING,
                    WEIR_EOF_MAX_BATCH_ORDERS=MAX_BATCH_ORDERS,
                    WEIR_EOF_CLOSED_RETENTION_MS=2000,
                    WEIR_EOF_IDLE_TIMEOUT_MS=60_000,
                )
            results = await asyncio.gather(*runs)
        return {report["client"]: report for report in results}

    killed_at_ms: list[int] = []
    reports = asyncio.run(scenario())
    assert_reports_exact(reports, clients)
    # The gateway keeps the first report per client; the topic, read_committed, shows every one.
    records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(TOPIC_REPORTS)))
    per_client = Counter(orjson.loads(record.value)["client"] for record in records)
    assert per_client == dict.fromkeys(clients, 1), f"reports per client on the topic: {per_client}"
    [killed] = killed_at_ms
    before = sum(1 for record in records if record.timestamp < killed)
    assert before < len(clients), "every report was out before the kill: it hit no work in flight"
    assert_cleaned_up(pipeline)
