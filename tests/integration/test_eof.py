"""End-of-stream per client end to end: gateway, parallel filter processes, controller, group-by/aggregate, joiner, cleanup."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from app.codec import dumps
from app.eof_gateway import Gateway, batched
from app.kafka_io import produce, read_topic
from examples.eof_orders import JOB_SETTING, ORDERS
from shop.catalogue import CATALOGUE_CENTS
from tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_JOIN, TOPIC_REPORTS, EofJob, filter_batch, reference_report
from tests.integration.conftest import Pipeline
from tests.integration.eof_jobs import WORDS, word_lines

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
    records = asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(f"{table}-changelog"), until=lambda _: False, timeout_s=2.0))
    return {orjson.loads(record.key): (orjson.loads(record.value) if record.value is not None else None) for record in records}


#: What a stage's value holds of a client besides the bookkeeping a tombstone keeps (client, times, closed).
CLIENT_DATA = {
    "eof_counters": ("sent_total", "reported", "finish_sent"),
    "eof_totals": ("seen", "records", "totals", "expected", "flushed"),
    "eof_joins": ("has_side", "side", "totals", "reported"),
}


def assert_every_stage_held_and_dropped(pipeline: Pipeline, clients: list[str], timeout_s: float = 60.0) -> None:
    """The cleanup broadcast reached every stage with per-client state: each client's last value in every such table
    (read_committed, from the changelog) holds none of its data any more (a tombstone or nothing), and every table
    did hold data of each client before (else the check would prove nothing)."""
    deadline = time.monotonic() + timeout_s
    holding: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        holding = {}
        for table, fields in CLIENT_DATA.items():
            values = last_values(pipeline, table)
            holding[table] = [c for c in clients if values.get(c) is not None and any(values[c].get(f) for f in fields)]
        if not any(holding.values()):
            break
        time.sleep(1.0)
    else:
        raise AssertionError(f"clients whose data a stage still holds after the report and {timeout_s}s: {holding}")
    for table, fields in CLIENT_DATA.items():
        records = asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(f"{table}-changelog"), until=lambda _: False, timeout_s=2.0))
        held = {orjson.loads(r.key) for r in records if r.value is not None and any(orjson.loads(r.value).get(f) for f in fields)}
        never = [client for client in clients if client not in held]
        assert not never, f"{table} never held data of {never}: the cleanup check proves nothing there"


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


async def run_all(
    pipeline: Pipeline, clients: dict[str, list[Any]], timeout_s: float = 240.0, side: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    async with Gateway(pipeline.bootstrap, pipeline.topic) as gateway:
        results = await asyncio.gather(
            *(
                gateway.run_client(c, lines, batch_size=BATCH_SIZE, timeout_s=timeout_s, side=(side or {}).get(c))
                for c, lines in clients.items()
            )
        )
    return {report["client"]: report for report in results}


def test_twenty_clients_get_exact_reports_and_are_cleaned_up(pipeline: Pipeline) -> None:
    clients = make_clients(seed=20, count=20)
    # Two clients price with their own lists (one flavour missing: reported unpriced); the others with the catalogue.
    prices = {"screen-1": SHOP_PRICES, "screen-5": SHOP_PRICES}
    start_eof_workers(pipeline, WEIR_EOF_IDLE_TIMEOUT_MS=30_000, WEIR_EOF_CLOSED_RETENTION_MS=20_000)
    started = time.monotonic()
    reports = asyncio.run(run_all(pipeline, clients, side=prices))
    elapsed = time.monotonic() - started
    batches = sum(len(batched(lines, BATCH_SIZE)) for lines in clients.values())
    print(f"\n20 clients, {batches} batches, {sum(map(len, clients.values()))} lines: all reports in {elapsed:.1f}s")
    assert_reports_exact(reports, clients, prices)
    assert reports["screen-0"]["orders"] == 0
    assert reports["screen-0"]["status"] == "complete"
    assert all(report["status"] == "complete" for report in reports.values())
    assert reports["screen-1"]["unpriced"] == [FLAVOURS[0]]
    assert all(report["unpriced"] == [] for client, report in reports.items() if client not in prices)
    # The tombstones' retention (20 s) outlasts this check: what it sees is the cleanup broadcast, not the expiry.
    assert_every_stage_held_and_dropped(pipeline, list(clients), timeout_s=15.0)
    assert_cleaned_up(pipeline, timeout_s=60.0)


def test_idle_client_is_reported_abandoned(pipeline: Pipeline) -> None:
    start_eof_workers(pipeline, WEIR_EOF_IDLE_TIMEOUT_MS=3000)
    lines = client_lines(random.Random(3), "quiet", 4, 0.0)

    async def scenario() -> dict[str, Any]:
        async with Gateway(pipeline.bootstrap, pipeline.topic) as gateway:
            records = [
                (f"quiet/{number}".encode(), dumps({"client": "quiet", "batch_id": number, "lines": batch}))
                for number, batch in enumerate(batched(lines, BATCH_SIZE))
            ]
            await produce(pipeline.bootstrap, pipeline.topic(TOPIC_BATCHES), records)  # no end: the screen went quiet
            return await gateway.report("quiet", timeout_s=60)

    report = asyncio.run(scenario())
    assert report["status"] == "abandoned"
    assert report["batches_sent"] is None
    assert report["batches_reported"] == 4
    assert_cleaned_up(pipeline)


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


async def produce_at(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[tuple[int, int]]:
    """Send records; their (partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(topic, key=key, value=value) for key, value in records]
        return [(metadata.partition, metadata.offset) for metadata in await asyncio.gather(*sent)]
    finally:
        await producer.stop()


def wait_until_committed(trace: Path, topic: str, positions: list[tuple[int, int]], timeout_s: float) -> None:
    """Until a worker committed every position of ``topic`` (WEIR_TRACE_FILE), under exactly_once with what it sent."""
    deadline = time.monotonic() + timeout_s
    pending = positions
    while time.monotonic() < deadline:
        committed: dict[int, int] = {}
        for line in trace.read_text().splitlines() if trace.exists() else []:
            _, _, what, name, partition, offset = line.split()
            if what == "commit" and name == topic:
                committed[int(partition)] = max(committed.get(int(partition), -1), int(offset))
        pending = [(partition, offset) for partition, offset in positions if committed.get(partition, -1) <= offset]
        if not pending:
            return
        time.sleep(0.5)
    raise AssertionError(f"{len(pending)} records of {topic} not committed after {timeout_s}s, e.g. {pending[:3]}")


def test_duplicated_counter_reports_batches_side_data_and_totals_change_nothing(pipeline: Pipeline, tmp_path: Path) -> None:
    clients = make_clients(seed=7, count=8)
    trace = tmp_path / "trace.txt"
    # Tombstones outlast the test's late duplicates: a duplicate after the retention would open a stray key.
    start_eof_workers(pipeline, WEIR_EOF_IDLE_TIMEOUT_MS=30_000, WEIR_EOF_CLOSED_RETENTION_MS=15_000, WEIR_TRACE_FILE=trace)
    late_totals: list[tuple[int, int]] = []

    async def scenario() -> dict[str, dict[str, Any]]:
        duplicates_batches: list[tuple[bytes, bytes]] = []
        duplicates_reports: list[tuple[bytes, bytes]] = []
        # The joiner gets each client's side data before the gateway sends it (the same, none: nothing changes).
        duplicates_side = [(c.encode(), dumps({"kind": "side", "client": c, "side": None})) for c in clients]
        for client, lines in clients.items():
            for batch_id, batch in enumerate(batched(lines, BATCH_SIZE)):
                if batch_id % 3:
                    continue
                duplicates_batches.append(
                    (f"{client}/{batch_id}".encode(), dumps({"client": client, "batch_id": batch_id, "lines": batch}))
                )
                outcome = filter_batch(batch_id, batch, ORDERS, MAX_BATCH_ORDERS)
                report = {"kind": "filtered", "client": client, "batch_id": batch_id, "forwarded": len(outcome.forwarded)}
                duplicates_reports.append((client.encode(), dumps(report)))
                for out_id, orders in outcome.forwarded:
                    forwarded = {"kind": "batch", "client": client, "batch_id": out_id, "records": orders}
                    duplicates_batches.append((client.encode(), dumps(forwarded)))
        # Reports, forwarded batches and side data injected *before* the real ones, then the input batches again.
        await produce(pipeline.bootstrap, pipeline.topic(TOPIC_JOIN), duplicates_side)
        await produce(pipeline.bootstrap, pipeline.topic(TOPIC_COUNTER), duplicates_reports)
        await produce(
            pipeline.bootstrap, pipeline.topic(TOPIC_AGGREGATE), [record for record in duplicates_batches if b"/" not in record[0]]
        )
        await produce(pipeline.bootstrap, pipeline.topic(TOPIC_BATCHES), [record for record in duplicates_batches if b"/" in record[0]])

        async with Gateway(pipeline.bootstrap, pipeline.topic) as gateway:

            async def run_then_redeliver_totals(client: str, lines: list[str]) -> dict[str, Any]:
                report = await gateway.run_client(client, lines, batch_size=BATCH_SIZE, timeout_s=240)
                # The aggregator's totals again, twice, once the report is out: the joiner (reported, or a tombstone
                # by then) sends no second report.
                totals = (client.encode(), dumps({"kind": "totals", "client": client, **client_totals(lines)}))
                late_totals.extend(await produce_at(pipeline.bootstrap, pipeline.topic(TOPIC_JOIN), [totals, totals]))
                return report

            results = await asyncio.gather(*(run_then_redeliver_totals(client, lines) for client, lines in clients.items()))
        return {report["client"]: report for report in results}

    reports = asyncio.run(scenario())
    assert_reports_exact(reports, clients)
    # Once the joiner committed the redelivered totals, a second report would be on the topic.
    wait_until_committed(trace, pipeline.topic(TOPIC_JOIN), late_totals, timeout_s=60)
    records = asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(TOPIC_REPORTS), until=lambda _: False, timeout_s=3.0))
    assert Counter(orjson.loads(record.value)["client"] for record in records) == dict.fromkeys(clients, 1)
    assert_cleaned_up(pipeline, timeout_s=60.0)


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
    records = asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(TOPIC_REPORTS), until=lambda _: False, timeout_s=3.0))
    per_client = Counter(orjson.loads(record.value)["client"] for record in records)
    assert per_client == dict.fromkeys(clients, 1), f"reports per client on the topic: {per_client}"
    [killed] = killed_at_ms
    before = sum(1 for record in records if record.timestamp < killed)
    assert before < len(clients), "every report was out before the kill: it hit no work in flight"
    assert_cleaned_up(pipeline)


def test_a_job_of_one_s_own_runs_through_the_same_stages_and_a_failing_merge_fails_its_client_alone(pipeline: Pipeline) -> None:
    """WEIR_EOF_JOB names another job (words counted per client, tests/integration/eof_jobs.py): exact reports, one
    client's poison record fails that client's report (``failed``, with the error) while the others complete, and
    every stage is cleaned up."""
    rng = random.Random(5)
    clients: dict[str, list[Any]] = {f"reader-{n}": word_lines(rng, 40 + 13 * n) for n in range(4)}
    clients["reader-poisoned"] = [*word_lines(rng, 20), "poison", *word_lines(rng, 20)]
    side = {"reader-1": 3}  # this client's report keeps the words said at least 3 times
    start_eof_workers(pipeline, WEIR_EOF_JOB="tests.integration.eof_jobs:WORDS", WEIR_EOF_IDLE_TIMEOUT_MS=30_000)
    reports = asyncio.run(run_all(pipeline, clients, side=side))
    poisoned = reports.pop("reader-poisoned")
    assert poisoned["status"] == "failed"
    assert "merge of batch" in poisoned["error"]
    assert "ValueError: poison in the merge" in poisoned["error"]
    healthy = {client: lines for client, lines in clients.items() if client != "reader-poisoned"}
    assert_reports_exact(reports, healthy, side, job=WORDS)
    assert all(report["status"] == "complete" and report["words"] for report in reports.values())
    assert min(reports["reader-1"]["words"].values()) >= 3
    assert_every_stage_held_and_dropped(pipeline, list(clients), timeout_s=15.0)
