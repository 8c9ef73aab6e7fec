"""Where a light run's slowest orders spend their time, the broker's side included.

    python -m bench.reader_probe [--inline] [--runs 3] [--orders 10000]

The weir pipeline of ``bench.compare`` (three stages, or ``--inline``) runs the same sequence as there: a warm-up,
then per run a backlog, 2 s, 20 orders/s for 10 s, 2 s, half the backlog rate for 10 s. During each 20 orders/s
run a second pair of clients asks the broker for the results topic's high watermark and last stable offset
(read_uncommitted and read_committed ListOffsets) every few milliseconds. For each run's five slowest orders
it prints, from the order's send: the result's create time (the worker made it), when the high watermark passed
it (written), when the last stable offset passed it (its transaction's commit marker written: readable), and when
the harness's reader saw it. Time between the last two is the reader's; before them, the worker's or the broker's.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from bench import compare
from bench._util import broker_pid, topic_partitions
from weir.app.kafka_io import delete_topics
from weir.app.settings import default_bootstrap

#: (time, last stable offsets, high watermarks) per poll, partition -> offset
Poll = tuple[float, dict[int, int], dict[int, int]]


async def follow_offsets(bootstrap: str, topic: str, polls: list[Poll], stop: asyncio.Event) -> None:
    """Note ``topic``'s last stable offsets and high watermarks in ``polls`` until ``stop``."""
    committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    written = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_uncommitted")
    await committed.start()
    await written.start()
    try:
        partitions = await topic_partitions(committed, topic)
        while not stop.is_set():
            stable, high = await committed.end_offsets(partitions), await written.end_offsets(partitions)
            polls.append((time.time(), {tp.partition: stable[tp] for tp in partitions}, {tp.partition: high[tp] for tp in partitions}))
            await asyncio.sleep(0.005)
    finally:
        await committed.stop()
        await written.stop()


def passed(polls: list[Poll], partition: int, offset: int, *, stable: bool) -> float | None:
    """When the first poll saw the last stable offset (``stable``) or the high watermark beyond ``offset``."""
    for moment, stable_offsets, high_watermarks in polls:
        if (stable_offsets if stable else high_watermarks)[partition] > offset:
            return moment
    return None


async def light_run(ctx: compare.Context, pipeline: compare.Pipeline, first: int, count: int, rate: float) -> None:
    polls: list[Poll] = []
    stop = asyncio.Event()
    follower = asyncio.create_task(follow_offsets(ctx.bootstrap, pipeline.results_topic, polls, stop))
    try:
        figures = await compare.orders_run(ctx, pipeline, first, count, rate)
    finally:
        stop.set()
        await follower
    sent, seen, stamped = figures["sent_at"], figures["seen"], figures["stamped"]
    print(f"  {rate:g} orders/s: p99 {figures['p99_ms']:.0f} ms ({len(polls)} polls of the offsets)", flush=True)

    def after(key: str, moment: float | None) -> str:
        return f"{1000 * (moment - sent[key]):6.0f}" if moment is not None else "     -"

    for key in sorted(sent, key=lambda key: seen[key] - sent[key], reverse=True)[:5]:
        partition, offset = figures["placed"][key]
        written, readable = (passed(polls, partition, offset, stable=stable) for stable in (False, True))
        print(
            f"    {key} (partition {partition}, offset {offset}), ms after its send: made {after(key, stamped[key])},"
            f" written {after(key, written)}, readable {after(key, readable)}, seen {after(key, seen[key])}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inline", action="store_true", help="the items inline pipeline (two splitters)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--orders", type=int, default=10_000, help="orders per backlog run")
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    run_id = uuid.uuid4().hex[:6]
    ctx = compare.Context(default_bootstrap(), run_id, args.runs, Path(tempfile.mkdtemp(prefix=f"weir-probe-{run_id}-")), broker_pid())
    ctx.warm_up = 2_000
    prefix = f"probe-{run_id}."
    if args.inline:
        pipeline_of = compare.weir_pipeline(
            ctx, "weir, items inline", prefix, {"WEIR_ITEMS_INLINE": "1"}, stages=compare.INLINE_STAGES, work=compare.WORK_INLINE
        )
    else:
        pipeline_of = compare.weir_pipeline(ctx, "weir", prefix)
    with pipeline_of as pipeline:
        asyncio.run(compare.orders_run(ctx, pipeline, 0, ctx.warm_up, None))
        first = ctx.warm_up
        for run in range(args.runs):
            backlog = asyncio.run(compare.orders_run(ctx, pipeline, first, args.orders, None))
            first += args.orders
            print(f"run {run + 1}: backlog {backlog['orders_per_s']:,.0f} orders/s", flush=True)
            time.sleep(compare.SETTLE_S)
            light = int(args.rate * 10)
            asyncio.run(light_run(ctx, pipeline, first, light, args.rate))
            first += light
            time.sleep(compare.SETTLE_S)
            half = backlog["orders_per_s"] / 2
            figures = asyncio.run(compare.orders_run(ctx, pipeline, first, int(half * 10), half))
            first += int(half * 10)
            print(f"  half the backlog rate ({half:,.0f} orders/s): p99 {figures['p99_ms']:.0f} ms", flush=True)
    asyncio.run(delete_topics(ctx.bootstrap, prefix))


if __name__ == "__main__":
    main()
