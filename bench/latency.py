"""Latency by offered rate, split/aggregate: `python -m bench.latency [--rates 20,100,250,400] [--seconds 30]`.

The three workers of `bench.compare`'s weir rows (one splitter+aggregator, two items processes, exactly_once,
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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from app.settings import load_settings
from bench._util import broker_pid, percentile
from bench.compare import ITEMS, SETTLE_S, Context, Pipeline, orders_run, weir_pipeline

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
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",") if rate.strip()]
    run_id = uuid.uuid4().hex[:6]
    ctx = Context(load_settings().bootstrap, run_id, 1, Path(tempfile.mkdtemp(prefix=f"weir-latency-{run_id}-")), broker_pid())
    traces = {name: ctx.work_dir / f"trace-{name}.txt" for name in ("split+agg", "items-1", "items-2")} if args.trace else {}
    print(f"command: {' '.join(['python -m bench.latency', *sys.argv[1:]])}")
    print(f"run id: {run_id} (topics lat-{run_id}.*, logs in {ctx.work_dir}); load average {os.getloadavg()[0]:.2f} at start")
    with weir_pipeline(ctx, "weir", f"lat-{run_id}.", {}, traces) as pipeline:
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
            cpu = " · ".join(f"{name} {percent:.0f}" for name, percent in figures["cpu"].items())
            cells = [_ms(latencies, fraction) for fraction in (0.5, 0.9, 0.99, 0.999, 1.0)]
            print(f"| {rate:g} | {figures['count']:,} | {' | '.join(cells)} | {cpu} |", flush=True)
            notes.extend(f"{rate:g}/s, {name}: {summary}" for name, summary in figures["traces"].items())
    if notes:
        print()
        print("\n".join(notes))


if __name__ == "__main__":
    main()
