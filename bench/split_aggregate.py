"""Split/aggregate throughput and latency on the real broker: `python -m bench.split_aggregate`.

Starts one splitter+aggregator worker and two items workers (separate processes), then measures
(1) a backlog: N orders of 10 items sent at once, orders/s and items/s until the last merged result is
committed, and latency per order (order record timestamp -> result record timestamp); (2) a light load
at a fixed rate, latency p50/p99. Prints one table. Figures depend on the machine; the README quotes a run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from examples.pricing import STEP as DEMO_STEP
from weir.app.kafka_io import delete_topics, ensure_topics, read_topic
from weir.app.processes import WorkerProcess
from weir.app.settings import load_settings

FLAVOURS = ["vanilla", "chocolate", "strawberry", "pistachio", "lemon", "mint"]


def _order(number: int, items: int) -> bytes:
    return orjson.dumps(
        {"order_id": f"b-{number}", "items": [{"flavour": FLAVOURS[(number + i) % 6], "scoops": 1 + i % 3} for i in range(items)]}
    )


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _send(bootstrap: str, topic: str, first: int, count: int, items: int, rate: float | None) -> dict[str, float]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
    await producer.start()
    sent_at: dict[str, float] = {}
    started = time.monotonic()
    try:
        for offset in range(count):
            number = first + offset
            if rate:
                delay = started + offset / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            sent_at[f"b-{number}"] = time.time()
            await producer.send(topic, key=f"b-{number}".encode(), value=_order(number, items))
        await producer.flush()
    finally:
        await producer.stop()
    return sent_at


async def _measure(bootstrap: str, prefix: str, first: int, count: int, items: int, rate: float | None, timeout_s: float) -> dict[str, Any]:
    wanted = {f"b-{number}" for number in range(first, first + count)}
    started = time.monotonic()
    reader = asyncio.create_task(
        read_topic(
            bootstrap,
            f"{prefix}aggregates",
            until=lambda rows: wanted <= {row.key.decode() for row in rows},
            timeout_s=timeout_s,
        )
    )
    sent_at = await _send(bootstrap, f"{prefix}orders", first, count, items, rate)
    rows = await reader
    elapsed = time.monotonic() - started
    latencies = [row.timestamp / 1000 - sent_at[row.key.decode()] for row in rows if row.key.decode() in sent_at]
    done = len({row.key.decode() for row in rows} & wanted)
    return {
        "orders": done,
        "seconds": elapsed,
        "orders_per_s": done / elapsed,
        "items_per_s": done * items / elapsed,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * _percentile(latencies, 0.99) if latencies else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=2000, help="orders in the backlog run")
    parser.add_argument("--items", type=int, default=10, help="items per order")
    parser.add_argument("--rate", type=float, default=20.0, help="orders/s offered in the light-load run")
    parser.add_argument("--light-seconds", type=float, default=15.0)
    parser.add_argument("--guarantee", default=os.environ.get("WEIR_GUARANTEE", "exactly_once"))
    parser.add_argument("--keep-topics", action="store_true", help="leave the run's topics on the broker (deleted by default)")
    args = parser.parse_args()
    settings = load_settings()
    run = uuid.uuid4().hex[:6]
    prefix = f"bench-{run}."
    log_dir = Path(tempfile.mkdtemp(prefix=f"weir-bench-{run}-"))
    env = {
        "WEIR_ITEM_PROCESSOR": DEMO_STEP,
        **os.environ,
        "WEIR_TOPIC_PREFIX": prefix,
        "WEIR_APP_ID": f"bench-{run}",
        "WEIR_GUARANTEE": args.guarantee,
    }
    names = [f"{prefix}{name}" for name in ("orders", "items", "item-results", "aggregates", "dead-letters")]
    asyncio.run(ensure_topics(settings.bootstrap, names, settings.partitions))
    stages = ("splitter,aggregator", "items", "items")
    workers = [
        WorkerProcess(agents, {**env, "WEIR_DATA_DIR": str(log_dir / f"data-{number}")}, log_dir / f"worker-{number}.log", 6200 + number)
        for number, agents in enumerate(stages)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready()
        backlog = asyncio.run(_measure(settings.bootstrap, prefix, 0, args.orders, args.items, None, timeout_s=600))
        light_count = int(args.rate * args.light_seconds)
        time.sleep(2.0)  # the backlog's last commits and timers settle: the light run measures the light load alone
        light = asyncio.run(_measure(settings.bootstrap, prefix, args.orders, light_count, args.items, args.rate, timeout_s=300))
    finally:
        for worker in workers:
            worker.stop()
        if not args.keep_topics:
            asyncio.run(delete_topics(settings.bootstrap, f"bench-{run}"))  # its topics and its app id's
    print(
        f"split/aggregate, {args.items} items per order, guarantee {args.guarantee}, {settings.partitions} partitions, 3 worker processes"
    )
    print(f"{'run':<28}{'orders':>8}{'orders/s':>10}{'items/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, figures in ((f"backlog of {args.orders}", backlog), (f"offered {args.rate:g} orders/s", light)):
        print(
            f"{name:<28}{figures['orders']:>8}{figures['orders_per_s']:>10.1f}{figures['items_per_s']:>10.0f}"
            f"{figures['p50_ms']:>9.0f}{figures['p99_ms']:>9.0f}"
        )
    print(f"worker logs: {log_dir}")


if __name__ == "__main__":
    main()
