"""Latency by offered rate, split/aggregate: `python -m bench.latency [--rates 20,100,250,400] [--seconds 30]`.

The three workers of `bench.compare`'s weir rows (each runs the splitter, items and aggregator agents, exactly_once,
4 partitions, orders of 10 items) on new topics. First a backlog (``--warm-up`` orders, default 1,000, sent
at once; its orders/s is printed), so that every stage and every changelog partition has written before a
latency is measured; then each rate of ``--rates`` for ``--seconds``, in that order, 2 s apart, offered
evenly. Per rate: orders, p50 / p90 / p99 / p99.9 / max latency from the order's send to its result's
arrival at a read_committed consumer (as in bench.compare), and the CPU of each process.

Why it exists: bench.compare's light-load p99 is the second slowest of 200 orders, so one slow commit
decides it; 20 orders/s for 30 s gives 600 orders, and a p99.9. ``--trace`` also sets WEIR_TRACE_FILE
for each worker and prints, per rate and worker, the commits (count, p50 / p99 / max duration, and their
wait at the commit gate) and the batches (count, mean size). Tracing writes a line per event: it slows the
workers, so its latencies are not the untraced ones.

``--hops`` splits each order's latency at its records' create times (the producer's clock, the same machine):
``split`` from the order's send to the splitter's first item record (the orders' fetch and the split),
``items`` from there to the last item outcome (the splitter's commit, the items workers' fetch and step),
``aggregate`` from there to the result record (the items worker's commit, the aggregator's fetch and merge),
``out`` from there to the result's arrival (the aggregator's commit, the reading consumer's fetch). It prints
p50 / p99 of each, and the hops of the slowest orders.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench._util import broker_pid, percentile
from bench.compare import ITEMS, PARTITIONS, SETTLE_S, WEIR_STAGES, Context, Pipeline, cpu_text, orders_run, weir_pipeline
from weir.app.kafka_io import delete_topics
from weir.app.settings import load_settings

_COMMIT = re.compile(r"commit-gate\+txn-([\d.]+)\+([\d.]+)ms")
_BATCH = re.compile(r"batch-(\d+)-")


def _ms(values: list[float], fraction: float) -> str:
    return f"{1000 * percentile(values, fraction):,.0f}" if values else "-"


def _trace_summary(path: Path, since: float, until: float) -> str:
    """Commits and batches a worker traced between two wall-clock times."""
    commits: list[tuple[float, float]] = []  # (gate wait, duration) in ms
    batches: list[int] = []
    if path.exists():
        with path.open() as lines:
            for line in lines:
                stamp, _, what, *_ = line.split(" ", 3)
                if not since <= float(stamp) <= until:
                    continue
                if (commit := _COMMIT.match(what)) is not None:
                    commits.append((float(commit.group(1)), float(commit.group(2))))
                elif (batch := _BATCH.match(what)) is not None:
                    batches.append(int(batch.group(1)))
    if not commits:
        return "no commits"
    durations = [duration / 1000 for _, duration in commits]
    waits = [wait / 1000 for wait, _ in commits]
    size = statistics.mean(batches) if batches else 0.0
    return (
        f"{len(commits)} commits, duration p50/p99/max {_ms(durations, 0.5)}/{_ms(durations, 0.99)}/{_ms(durations, 1.0)} ms, "
        f"gate wait p50/p99 {_ms(waits, 0.5)}/{_ms(waits, 0.99)} ms; {len(batches)} batches of {size:.1f} events"
    )


HOPS = ("split", "items", "aggregate", "out")


async def _create_times(bootstrap: str, topic: str) -> list[tuple[str, float]]:
    """Every committed record of ``topic`` as (key, create time in s), read to its end."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, number) for number in range(PARTITIONS)]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        records: list[tuple[str, float]] = []
        deadline = time.monotonic() + 60
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]] and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                records.extend((record.key.decode() if record.key else "", record.timestamp / 1000) for record in batch)
        return records
    finally:
        await consumer.stop()


def hops(bootstrap: str, prefix: str, sent_at: dict[str, float], seen: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per order: its latency cut at the create times of its records on the way (see ``--hops``), in s."""
    first_item: dict[str, float] = {}
    for key, stamp in asyncio.run(_create_times(bootstrap, f"{prefix}items")):
        order = key.partition("#")[0]
        if order in sent_at:
            first_item[order] = min(stamp, first_item.get(order, stamp))
    last_outcome: dict[str, float] = collections.defaultdict(float)
    for key, stamp in asyncio.run(_create_times(bootstrap, f"{prefix}item-results")):
        if key in sent_at:
            last_outcome[key] = max(stamp, last_outcome[key])
    result = {key: stamp for key, stamp in asyncio.run(_create_times(bootstrap, f"{prefix}aggregates")) if key in sent_at}
    cut: dict[str, dict[str, float]] = {}
    for order, sent in sent_at.items():
        if order in first_item and order in last_outcome and order in result and order in seen:
            stamps = (sent, first_item[order], last_outcome[order], result[order], seen[order])
            cut[order] = {hop: stamps[number + 1] - stamps[number] for number, hop in enumerate(HOPS)}
    return cut


def _hop_lines(rate: float, cut: dict[str, dict[str, float]], latencies: dict[str, float], slowest: int) -> list[str]:
    if not cut:
        return [f"{rate:g}/s: no hops (records not found)"]
    by_hop = {hop: [hops[hop] for hops in cut.values()] for hop in HOPS}
    spread = ", ".join(f"{hop} {_ms(values, 0.5)}/{_ms(values, 0.99)}" for hop, values in by_hop.items())
    lines = [f"{rate:g}/s, hops p50/p99 ms: {spread}"]
    for order in sorted(cut, key=lambda key: -latencies[key])[:slowest]:
        parts = " + ".join(f"{hop} {1000 * cut[order][hop]:.0f}" for hop in HOPS)
        lines.append(f"  {order}: {1000 * latencies[order]:.0f} ms = {parts}")
    return lines


def _rate_run(ctx: Context, pipeline: Pipeline, first: int, rate: float, seconds: float, traces: dict[str, Path]) -> dict[str, Any]:
    count = int(rate * seconds)
    began = time.time()
    figures = asyncio.run(orders_run(ctx, pipeline, first, count, rate))
    figures["count"] = count
    figures["traces"] = {name: _trace_summary(path, began, time.time()) for name, path in traces.items()}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="20,100,250,400", help="orders/s offered, comma-separated, in this order")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each rate's run")
    parser.add_argument("--warm-up", type=int, default=1000, help="orders in the backlog before the rates")
    parser.add_argument("--trace", action="store_true", help="WEIR_TRACE_FILE per worker: commits and batches per rate")
    parser.add_argument(
        "--separate", action="store_true", help="one process per role: splitter, aggregator, two items (default: bench.compare's three)"
    )
    parser.add_argument("--hops", type=int, default=0, metavar="N", help="latency per hop; N: also the hops of the N slowest orders")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    run_id = uuid.uuid4().hex[:6]
    ctx = Context(load_settings().bootstrap, run_id, 1, Path(tempfile.mkdtemp(prefix=f"weir-latency-{run_id}-")), broker_pid())
    stages = {"split": "splitter", "agg": "aggregator", "items-1": "items", "items-2": "items"} if args.separate else WEIR_STAGES
    traces = {name: ctx.work_dir / f"trace-{name}.txt" for name in stages} if args.trace else {}
    print(f"command: {' '.join(['python -m bench.latency', *sys.argv[1:]])}")
    print(f"run id: {run_id} (topics lat-{run_id}.*, logs in {ctx.work_dir}); load average {os.getloadavg()[0]:.2f} at start")
    prefix = f"lat-{run_id}."
    try:
        with weir_pipeline(ctx, "weir", prefix, {}, traces, stages) as pipeline:
            backlog = asyncio.run(orders_run(ctx, pipeline, 0, args.warm_up, None))
            print(f"warm-up backlog of {args.warm_up:,} orders: {backlog['orders_per_s']:,.0f} orders/s ({ITEMS} items each)")
            print()
            print("| offered orders/s | orders | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | CPU, % of one core |")
            print("|---:|---:|---:|---:|---:|---:|---:|---|")
            first = args.warm_up
            notes: list[str] = []
            for rate in rates:
                time.sleep(SETTLE_S)
                figures = _rate_run(ctx, pipeline, first, rate, args.seconds, traces)
                first += figures["count"]
                latencies = figures["latencies"]
                cpu = cpu_text(figures["cpu"])
                cells = [_ms(latencies, fraction) for fraction in (0.5, 0.9, 0.99, 0.999, 1.0)]
                print(f"| {rate:g} | {figures['count']:,} | {' | '.join(cells)} | {cpu} |", flush=True)
                notes.extend(f"{rate:g}/s, {name}: {summary}" for name, summary in figures["traces"].items())
                if args.hops:
                    latency_of = {key: figures["seen"][key] - sent for key, sent in figures["sent_at"].items()}
                    notes.extend(_hop_lines(rate, hops(ctx.bootstrap, prefix, figures["sent_at"], figures["seen"]), latency_of, args.hops))
    finally:
        asyncio.run(delete_topics(ctx.bootstrap, f"lat-{run_id}"))  # its topics (and its app id's) would pile up on a long-running broker
    if notes:
        print()
        print("\n".join(notes))


if __name__ == "__main__":
    main()
