"""Side-by-side figures on one broker, in one run: `python -m bench.compare [--quick] [--only ...] [--profile DIR]`.

Same local Kafka broker, same messages (150-200 byte JSON; orders of 10 items), 4 partitions, new topic
names and group ids per run. Prints one table with min / median / max over the runs (3, or 1 with
--quick) for each figure, and the CPU each process used over the measured interval (median run, % of one
core, from /proc/<pid>/stat), and writes it as markdown to bench/results.md:

- the ceiling: raw aiokafka produce, consume, consume + json.loads (msg/s);
- plain Faust (bench/plain_faust.py, its own `faust worker` process, Faust's default at_least_once):
  a pass-through agent, measured on its output topic, and a count by key into a RocksDB table, measured on
  the table's changelog (msg/s);
- weir's split/aggregate (one splitter+aggregator process, two items processes, exactly_once) and the same
  pipeline on Quix Streams (bench/quix_split_aggregate.py, one process, exactly-once): a backlog of orders
  sent at once (orders/s, items/s, latency p50/p99 from the order's send to the result read by a
  read_committed consumer) and a fixed offered rate (latency).

--profile DIR also records each weir worker with py-spy during the first backlog run (flame graph SVG and
collapsed stacks in DIR); give --orders enough for the backlog to outlast --profile-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from app.kafka_io import ensure_topics
from app.processes import ROOT, WorkerProcess
from bench._util import Collector, CpuMeter, Proc, broker_pid, end_offsets_total, order, percentile, record

PARTITIONS = 4
ITEMS = 10
SECTIONS = ("raw", "faust", "weir", "quix")


@dataclass
class Figure:
    """One row: a value per run, and the CPU of each process per run."""

    system: str
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    fmt: str = "{:,.0f}"

    def add(self, value: float, cpu: dict[str, float] | None = None) -> None:
        self.values.append(value)
        self.cpu.append(cpu or {})

    def cells(self) -> list[str]:
        if not self.values:
            return ["-", "-", "-", "-"]
        ordered = sorted(self.values)
        median_run = self.values.index(ordered[(len(ordered) - 1) // 2])
        cpu = " · ".join(f"{name} {percent:.0f}" for name, percent in self.cpu[median_run].items())
        return [self.fmt.format(ordered[0]), self.fmt.format(statistics.median(ordered)), self.fmt.format(ordered[-1]), cpu]


@dataclass
class Context:
    bootstrap: str
    run_id: str
    runs: int
    work_dir: Path
    broker: int | None
    figures: list[Figure] = field(default_factory=list)

    def figure(self, system: str, name: str, unit: str, fmt: str = "{:,.0f}") -> Figure:
        created = Figure(system, name, unit, fmt=fmt)
        self.figures.append(created)
        return created

    def meter(self, workers: dict[str, int]) -> CpuMeter:
        pids = {"broker": self.broker} if self.broker else {}
        return CpuMeter({**pids, **workers, "bench": os.getpid()})


# --- the ceiling: raw aiokafka -------------------------------------------------------------------------


async def _raw_produce(bootstrap: str, topic: str, count: int) -> float:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    values = [record(number) for number in range(count)]
    keys = [f"c-{number % 1000:04d}".encode() for number in range(count)]
    try:
        started = time.monotonic()
        for key, value in zip(keys, values, strict=True):
            await producer.send(topic, key=key, value=value)
        await producer.flush()
        return count / (time.monotonic() - started)
    finally:
        await producer.stop()


async def _raw_consume(bootstrap: str, topic: str, count: int, decode: Callable[[bytes], Any] | None) -> float:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        started = time.monotonic()
        read = 0
        while read < count:
            batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for messages in batch.values():
                read += len(messages)
                if decode is not None:
                    for message in messages:
                        decode(message.value)
        return read / (time.monotonic() - started)
    finally:
        await consumer.stop()


def run_raw(ctx: Context, count: int) -> None:
    produce = ctx.figure("aiokafka", f"raw produce, {count:,} msgs", "msg/s")
    consume = ctx.figure("aiokafka", "raw consume", "msg/s")
    consume_json = ctx.figure("aiokafka", "raw consume + json.loads", "msg/s")
    import json

    for run in range(ctx.runs):
        topic = f"cmp-{ctx.run_id}.raw-{run}"
        asyncio.run(ensure_topics(ctx.bootstrap, [topic], PARTITIONS))
        for target, step in (
            (produce, lambda topic=topic: _raw_produce(ctx.bootstrap, topic, count)),
            (consume, lambda topic=topic: _raw_consume(ctx.bootstrap, topic, count, None)),
            (consume_json, lambda topic=topic: _raw_consume(ctx.bootstrap, topic, count, json.loads)),
        ):
            meter = ctx.meter({}).start()
            rate = asyncio.run(step())
            target.add(rate, meter.stop())


# --- plain Faust -----------------------------------------------------------------------------------------


async def _faust_backlog(ctx: Context, worker: Proc, source: str, watched: str, first: int, count: int) -> tuple[float, dict[str, float]]:
    """Sends ``count`` records to ``source``; msg/s until ``watched`` grew by ``count`` records."""
    probe = AIOKafkaConsumer(bootstrap_servers=ctx.bootstrap, group_id=None)
    await probe.start()
    producer = AIOKafkaProducer(bootstrap_servers=ctx.bootstrap, linger_ms=5)
    await producer.start()
    try:
        baseline = await end_offsets_total(probe, watched, PARTITIONS)
        meter = ctx.meter({"worker": worker.pid}).start()
        started = time.monotonic()
        for number in range(first, first + count):
            await producer.send(source, key=f"c-{number % 1000:04d}".encode(), value=record(number))
        await producer.flush()
        deadline = started + 600
        while await end_offsets_total(probe, watched, PARTITIONS) < baseline + count:
            worker.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{watched}: fewer than {count} new records after 600 s")
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - started
        return count / elapsed, meter.stop()
    finally:
        await producer.stop()
        await probe.stop()


def run_faust(ctx: Context, count: int) -> None:
    passthrough = ctx.figure("plain Faust", f"pass-through agent, backlog of {count:,}", "msg/s")
    counting = ctx.figure("plain Faust", f"count by key into RocksDB table, backlog of {count:,}", "msg/s")
    prefix = f"cmp-{ctx.run_id}.faust."
    app_id = f"cmp-{ctx.run_id}-faust"
    names = {"BENCH_PASS_IN": prefix + "pass-in", "BENCH_PASS_OUT": prefix + "pass-out", "BENCH_COUNT_IN": prefix + "count-in"}
    asyncio.run(ensure_topics(ctx.bootstrap, names.values(), PARTITIONS))
    env = {**os.environ, **names, "BENCH_APP_ID": app_id, "BENCH_DATA_DIR": str(ctx.work_dir / "faust-data")}
    faust = str(Path(sys.executable).parent / "faust")
    port = str(_free_port())
    command = [faust, "-A", "bench.plain_faust", "worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", port]
    worker = Proc(command, env, ctx.work_dir / "plain-faust.log").start()
    changelog = f"{app_id}-counts-changelog"
    try:
        worker.wait_for_log("Worker ready")
        asyncio.run(ensure_topics(ctx.bootstrap, [changelog], PARTITIONS))
        # Warm-up: both agents have read and written something before the clock starts.
        asyncio.run(_faust_backlog(ctx, worker, names["BENCH_PASS_IN"], names["BENCH_PASS_OUT"], 0, 100))
        asyncio.run(_faust_backlog(ctx, worker, names["BENCH_COUNT_IN"], changelog, 0, 100))
        for run in range(ctx.runs):
            first = 100 + run * count
            passthrough.add(*asyncio.run(_faust_backlog(ctx, worker, names["BENCH_PASS_IN"], names["BENCH_PASS_OUT"], first, count)))
            counting.add(*asyncio.run(_faust_backlog(ctx, worker, names["BENCH_COUNT_IN"], changelog, first, count)))
    finally:
        worker.stop()


# --- split/aggregate: weir and Quix Streams ----------------------------------------------------------------


@dataclass
class Pipeline:
    """A running split/aggregate pipeline: where orders go, where results come from, its processes."""

    system: str
    orders_topic: str
    results_topic: str
    workers: dict[str, int]
    alive: Callable[[], None]


async def _orders_run(
    ctx: Context, pipeline: Pipeline, first: int, count: int, rate: float | None, *, during: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Sends ``count`` orders (all at once, or at ``rate``/s) and waits for their results."""
    collector = await Collector(ctx.bootstrap, pipeline.results_topic).start()
    producer = AIOKafkaProducer(bootstrap_servers=ctx.bootstrap, linger_ms=2)
    await producer.start()
    sent_at: dict[str, float] = {}
    keys = [f"b-{number}" for number in range(first, first + count)]
    try:
        meter = ctx.meter(pipeline.workers).start()
        started, started_wall = time.monotonic(), time.time()
        if during is not None:
            during()
        for offset, key in enumerate(keys):
            if rate:
                delay = started + offset / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            sent_at[key] = time.time()
            await producer.send(pipeline.orders_topic, key=key.encode(), value=order(first + offset, ITEMS))
        await producer.flush()
        done = await collector.wait_for(keys, timeout_s=600, alive=pipeline.alive)
        pipeline.alive()
        if not done:
            missing = len(set(keys) - collector.seen.keys())
            raise TimeoutError(f"{pipeline.system}: {missing} of {count} orders without a result after 600 s")
        finished = max(collector.seen[key] for key in keys)
        elapsed = finished - started_wall
        cpu = meter.stop()
        latencies = [collector.seen[key] - sent_at[key] for key in keys]
        return {
            "orders_per_s": count / elapsed,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * percentile(latencies, 0.99),
            "cpu": cpu,
        }
    finally:
        await producer.stop()
        await collector.stop()


def _measure_pipeline(
    ctx: Context, pipeline: Pipeline, orders: int, rate: float, light_seconds: float, during_first: Callable[[], None] | None = None
) -> None:
    system = pipeline.system
    backlog = f"backlog of {orders:,} orders"
    orders_s = ctx.figure(system, f"{backlog}: orders/s", "orders/s", "{:,.1f}")
    items_s = ctx.figure(system, f"{backlog}: items/s", "items/s")
    p50 = ctx.figure(system, f"{backlog}: latency p50", "ms")
    p99 = ctx.figure(system, f"{backlog}: latency p99", "ms")
    light_count = int(rate * light_seconds)
    light = f"offered {rate:g} orders/s for {light_seconds:g} s"
    light_p50 = ctx.figure(system, f"{light}: latency p50", "ms")
    light_p99 = ctx.figure(system, f"{light}: latency p99", "ms")
    # Warm-up: every stage has handled an order before the clock starts.
    asyncio.run(_orders_run(ctx, pipeline, 0, 20, None))
    first = 20
    for run in range(ctx.runs):
        figures = asyncio.run(_orders_run(ctx, pipeline, first, orders, None, during=during_first if run == 0 else None))
        first += orders
        orders_s.add(figures["orders_per_s"], figures["cpu"])
        items_s.add(figures["orders_per_s"] * ITEMS, figures["cpu"])
        p50.add(figures["p50_ms"], figures["cpu"])
        p99.add(figures["p99_ms"], figures["cpu"])
        figures = asyncio.run(_orders_run(ctx, pipeline, first, light_count, rate))
        first += light_count
        light_p50.add(figures["p50_ms"], figures["cpu"])
        light_p99.add(figures["p99_ms"], figures["cpu"])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _profiler(workers: dict[str, int], out_dir: Path | None, seconds: int) -> Callable[[], None] | None:
    if out_dir is None:
        return None
    py_spy = str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)

    def start() -> None:
        # Collapsed stacks of every worker; a flame graph of the first (the splitter+aggregator) only: two
        # samplers on one process would double the pauses py-spy makes in it.
        for number, (name, pid) in enumerate(workers.items()):
            for fmt, suffix in (("raw", "txt"), ("flamegraph", "svg"))[: 2 if number == 0 else 1]:
                output = out_dir / f"{name}.{suffix}"
                command = [py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--format", fmt, "-o", str(output)]
                with Path(f"{output}.log").open("wb") as log:  # the child keeps its own copy of the descriptor
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)

    return start


def run_weir(ctx: Context, orders: int, rate: float, light_seconds: float, profile: Path | None, profile_seconds: int) -> None:
    prefix = f"cmp-{ctx.run_id}.weir."
    env = {**os.environ, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": f"cmp-{ctx.run_id}-weir", "WEIR_GUARANTEE": "exactly_once"}
    names = [f"{prefix}{name}" for name in ("orders", "items", "item-results", "aggregates", "dead-letters")]
    asyncio.run(ensure_topics(ctx.bootstrap, names, PARTITIONS))
    stages = {"split+agg": "splitter,aggregator", "items-1": "items", "items-2": "items"}
    workers = {
        name: WorkerProcess(
            agents, {**env, "WEIR_DATA_DIR": str(ctx.work_dir / f"weir-data-{name}")}, ctx.work_dir / f"weir-{name}.log", _free_port()
        )
        for name, agents in stages.items()
    }
    try:
        for worker in workers.values():
            worker.start()
        for worker in workers.values():
            worker.wait_ready()
        pids = {name: worker.process.pid for name, worker in workers.items() if worker.process is not None}

        def alive() -> None:
            for worker in workers.values():
                if worker.process is not None and worker.process.poll() is not None:
                    raise RuntimeError(f"weir worker {worker.agents} exited ({worker.log_path})")

        pipeline = Pipeline("weir", f"{prefix}orders", f"{prefix}aggregates", pids, alive)
        _measure_pipeline(ctx, pipeline, orders, rate, light_seconds, _profiler(pids, profile, profile_seconds))
    finally:
        for worker in workers.values():
            worker.stop()


def run_quix(ctx: Context, orders: int, rate: float, light_seconds: float) -> None:
    prefix = f"cmp-{ctx.run_id}.quix."
    orders_topic, items_topic, results_topic = f"{prefix}orders", f"{prefix}items", f"{prefix}aggregates"
    asyncio.run(ensure_topics(ctx.bootstrap, [orders_topic, items_topic, results_topic], PARTITIONS))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": ctx.bootstrap,
        "BENCH_APP_ID": f"cmp-{ctx.run_id}-quix",
        "BENCH_ORDERS": orders_topic,
        "BENCH_ITEMS": items_topic,
        "BENCH_AGGREGATES": results_topic,
        "BENCH_STATE_DIR": str(ctx.work_dir / "quix-state"),
    }
    worker = Proc([sys.executable, "-m", "bench.quix_split_aggregate"], env, ctx.work_dir / "quix.log").start()
    try:
        pipeline = Pipeline("Quix Streams", orders_topic, results_topic, {"worker": worker.pid}, worker.check_alive)
        _measure_pipeline(ctx, pipeline, orders, rate, light_seconds)
    finally:
        worker.stop()


# --- the table ---------------------------------------------------------------------------------------------


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError, StopIteration):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return f"{os.cpu_count()} cores ({model}), {system}, load average {load} (at start)"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("aiokafka", "faust-streaming", "quixstreams", "confluent-kafka", "rocksdict"):
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{package} {version(package)}")
    return ", ".join(found)


def table(ctx: Context, runs: int) -> list[str]:
    header = ["system", "figure", "unit", "min", "median", "max", "CPU, % of one core (median run)"]
    rows = [[figure.system, figure.name, figure.unit, *figure.cells()] for figure in ctx.figures]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if 3 <= i <= 5 else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


async def delete_topics(bootstrap: str, marker: str) -> int:
    """Deletes the topics of this run: every name holding ``marker`` (the run id is in all of them, internal ones too)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if marker in name]
        if names:
            await admin.delete_topics(names)
        return len(names)
    finally:
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run of each, smaller loads (a smoke test, under 2 minutes)")
    parser.add_argument("--runs", type=int, help="runs of each figure (default 3, 1 with --quick)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    parser.add_argument("--raw-messages", type=int, help="messages per raw aiokafka run (default 100,000; 30,000 with --quick)")
    parser.add_argument("--faust-messages", type=int, help="messages per plain Faust run (default 20,000; 5,000 with --quick)")
    parser.add_argument("--orders", type=int, help="orders of 10 items per backlog run (default 2,000; 300 with --quick)")
    parser.add_argument("--rate", type=float, default=20.0, help="orders/s offered in the fixed-rate runs")
    parser.add_argument("--light-seconds", type=float, help="length of a fixed-rate run (default 10 s; 5 s with --quick)")
    parser.add_argument("--profile", type=Path, help="record the weir workers with py-spy during the first backlog run, into DIR")
    parser.add_argument("--profile-seconds", type=int, default=20)
    parser.add_argument("--keep-topics", action="store_true", help="keep this run's topics on the broker (deleted by default)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results.md", help="markdown copy of the table")
    args = parser.parse_args()
    quick = args.quick
    runs = args.runs or (1 if quick else 3)
    raw_messages = args.raw_messages or (30_000 if quick else 100_000)
    faust_messages = args.faust_messages or (5_000 if quick else 20_000)
    orders = args.orders or (300 if quick else 2_000)
    light_seconds = args.light_seconds or (5.0 if quick else 10.0)
    sections = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}, expected some of {SECTIONS}")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:19092")
    run_id = uuid.uuid4().hex[:6]
    ctx = Context(bootstrap, run_id, runs, Path(tempfile.mkdtemp(prefix=f"weir-compare-{run_id}-")), broker_pid())
    command = " ".join(shlex.quote(part) for part in [Path(sys.executable).name, "-m", "bench.compare", *sys.argv[1:]])
    intro = [
        f"command: {command}",
        f"machine: {machine()}",
        f"broker: {bootstrap}" + (f" (local Apache Kafka, pid {ctx.broker})" if ctx.broker else " (external: no broker CPU)"),
        f"versions: {versions()}",
        f"runs: {runs} per figure; 4 partitions; messages are 150-200 byte JSON; orders have {ITEMS} items",
        f"run id: {run_id} (topics cmp-{run_id}.*, logs in {ctx.work_dir})",
    ]
    for line in intro:
        print(line, flush=True)
    started = time.monotonic()
    steps: dict[str, Callable[[], None]] = {
        "raw": lambda: run_raw(ctx, raw_messages),
        "faust": lambda: run_faust(ctx, faust_messages),
        "weir": lambda: run_weir(ctx, orders, args.rate, light_seconds, args.profile, args.profile_seconds),
        "quix": lambda: run_quix(ctx, orders, args.rate, light_seconds),
    }
    try:
        for name in sections:
            section_started = time.monotonic()
            steps[name]()
            print(f"  {name}: done in {time.monotonic() - section_started:.0f} s", flush=True)
    finally:
        if not args.keep_topics:
            deleted = asyncio.run(delete_topics(bootstrap, f"cmp-{run_id}"))
            print(f"  deleted this run's {deleted} topics (--keep-topics keeps them)", flush=True)
    elapsed = time.monotonic() - started
    notes = [
        "",
        "CPU: each process's utime+stime over the measured interval, as % of one core (200 = both cores), in the run that gave the median;",
        "'bench' is the harness itself (producer and reading consumer). The machine is shared: other work on it makes figures noisy.",
        "Latency: from the order's send to its result's arrival at a read_committed consumer (both pipelines commit every 0.5 s).",
        "weir: exactly_once, one splitter+aggregator process and two items processes. Quix Streams: exactly-once, one process,"
        " commit interval 0.5 s like weir's (Quix's default is 5 s), other settings Quix's defaults (consumer poll timeout 1 s)."
        f" Plain Faust: at_least_once (Faust's default), one process. Total time {elapsed:.0f} s.",
    ]
    lines = table(ctx, runs)
    print()
    for line in lines + notes:
        print(line)
    args.output.write_text("\n".join([*(f"    {line}" for line in intro), "", *lines, *notes]) + "\n")
    print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
