"""The shop under load: `python -m bench.shop_load [--screens 3,12,30] [--orders 300]`.

One shop deployment (its seven workers, as ``make demo`` starts them: orders+claims, two payments, two kitchens,
flows, end of day; exactly-once, the defaults) on new topics. Then, for each count of screens in ``--screens``, in
that order, a day of ``--orders`` orders spread over that many screens, each screen one customer at a time (the
demo's screens: a line is sent when the one before it has its outcome): 3 screens is an idle shop, more keep every
stage busy. Per day: orders/s, each line's latency from its send to its outcome (p50 / p99 / max), the workers' CPU
per order and the broker's, each worker's CPU (% of one core). Every day is audited like the demo's (one outcome per
line, money and stock balanced); a day that does not balance fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from bench._util import CpuMeter, broker_pid
from scripts.make_shop_orders import order_lines
from shop.demo import run_shop
from shop.screens import latencies_of, latency_ms
from tests.integration.conftest import Pipeline
from tests.integration.test_shop import assert_invariants, start_shop
from weir.app.kafka_io import delete_topics
from weir.app.settings import load_settings


def screens_of(count: int, orders: int, seed: int) -> dict[str, list[str]]:
    """``orders`` order lines over ``count`` screens (no scarce flavour: stock never decides an outcome)."""
    rng = random.Random(seed)
    per_screen = [orders // count + (1 if number < orders % count else 0) for number in range(count)]
    return {f"s{number + 1}": order_lines(number + 1, lines, rng, scarce_screen=False) for number, lines in enumerate(per_screen) if lines}


def day(pipeline: Pipeline, pids: dict[str, int], count: int, orders: int, seed: int, letters_before: set[bytes]) -> dict[str, Any]:
    """One day on ``count`` screens, audited against its own dead letters (those not in ``letters_before``, which
    gains them)."""
    screens = screens_of(count, orders, seed)
    meter = CpuMeter(pids).start()
    result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=120))
    cpu = meter.stop()
    letters = {orjson.dumps(letter, option=orjson.OPT_SORT_KEYS): letter for letter in result["dead_letters"]}
    result["dead_letters"] = [letter for raw, letter in letters.items() if raw not in letters_before]
    letters_before |= set(letters)
    assert_invariants(result, screens)
    latencies = latencies_of(result["progress"])
    workers_s = sum(seconds for name, seconds in meter.seconds.items() if name != "broker")
    return {
        "screens": count,
        "orders": len(latencies),
        "orders_s": len(latencies) / result["elapsed_s"],
        "p50_ms": latency_ms(latencies, 0.5),
        "p99_ms": latency_ms(latencies, 0.99),
        "max_ms": latency_ms(latencies, 1.0),
        "cpu_ms_per_order": 1000 * workers_s / len(latencies),
        "broker_cpu_ms_per_order": 1000 * meter.seconds["broker"] / len(latencies) if "broker" in meter.seconds else None,
        "cpu": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screens", default="3,12,30", help="counts of screens, one day each, in this order")
    parser.add_argument("--orders", type=int, default=300, help="orders per day")
    parser.add_argument("--seed", type=int, default=21)
    arguments = parser.parse_args(argv)
    counts = [int(part) for part in arguments.screens.split(",") if part.strip()]
    settings = load_settings()
    unique = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"weir-shop-load-{unique}-"))
    pipeline = Pipeline(bootstrap=settings.bootstrap, tmp=tmp, prefix=f"load{unique}.", app_id=f"load{unique}")
    print(f"weir shop under load: {arguments.orders} orders a day over {counts} screens, broker {pipeline.bootstrap}, logs in {tmp}")
    rows = []
    try:
        workers = start_shop(pipeline)
        pids = {
            f"{stage}-{number}": worker.process.pid
            for stage, group in workers.items()
            for number, worker in enumerate(group, start=1)
            if worker.process is not None
        }
        broker = broker_pid()
        if broker is not None:
            pids["broker"] = broker
        letters: set[bytes] = set()
        day(pipeline, pids, 3, 30, arguments.seed, letters)  # warm-up: every stage has served, every changelog written
        for number, count in enumerate(counts):
            time.sleep(2.0)
            rows.append(day(pipeline, pids, count, arguments.orders, arguments.seed + 1 + number, letters))
    finally:
        pipeline.stop_all()
    print("\n| screens | orders | orders/s | latency p50 | p99 | max | CPU per order, workers | CPU per order, broker |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        broker_ms = "-" if row["broker_cpu_ms_per_order"] is None else f"{row['broker_cpu_ms_per_order']:.2f} ms"
        print(
            f"| {row['screens']} | {row['orders']} | {row['orders_s']:,.1f} | {row['p50_ms']:,.0f} ms | {row['p99_ms']:,.0f} ms"
            f" | {row['max_ms']:,.0f} ms | {row['cpu_ms_per_order']:.2f} ms | {broker_ms} |"
        )
    for row in rows:
        busiest = sorted(row["cpu"].items(), key=lambda item: -item[1])
        print(f"  {row['screens']} screens, CPU % of one core: " + " · ".join(f"{name} {percent:.0f}" for name, percent in busiest))
    asyncio.run(delete_topics(pipeline.bootstrap, f"load{unique}"))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
