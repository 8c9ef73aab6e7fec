"""Side-by-side figures on one broker, in one run: `python -m bench.compare [--quick] [--only ...] [--profile DIR]`.

Same local Kafka broker, same messages (150-200 byte JSON; orders of 10 items), 4 partitions, new topic
names and group ids per run. Prints one table with min / median / max over the runs (3, or 1 with
--quick) for each figure, and the CPU each process used over the measured interval (median run, % of one
core, from /proc/<pid>/stat), and writes it as markdown to bench/results.md (and the same figures as JSON to
bench/results.json, which bench.charts draws):

- the ceiling: raw aiokafka produce, consume, consume + json.loads (msg/s);
- plain Faust (bench/plain_faust.py, its own `faust worker` process, Faust's default at_least_once):
  a pass-through agent, measured on its output topic, and a count by key into a RocksDB table, measured on
  the table's changelog (msg/s);
- weir's split/aggregate, like with like with Quix Streams (bench/quix_split_aggregate.py), exactly-once on
  both sides, the same commit interval, chunk size and producer linger, as many Quix processes (one consumer
  group) as weir workers: weir inline (two splitter processes) against Quix inline (one stage, two processes);
  weir's three stages (three processes, each running the splitter, items and aggregator agents on its share of
  the partitions, as Quix's and Kafka Streams' processes each run every stage; --weir-layout roles runs one
  splitter+aggregator process and two items processes instead) against Quix's three stages with
  chunks of 10 (three processes); and Quix's per-item form (one record per item, three processes), labelled as
  such: a backlog of orders sent at once (orders/s, items/s, the workers' CPU and CPU per order, the broker's
  beside it, latency p50/p99 from the order's send to the result read by a read_committed consumer), a fixed
  offered rate, and half the rate the backlog run sustained (latency). Every result is checked against its
  order's catalogue total; a like-with-like table of these rows heads results.md;
- weir's counter trigger (agents/triggers.py, one `triggers` worker process): a backlog of registrations, then
  the children's completions shuffled across parents, sent at once; completion events/s until every parent's
  wake is read (read_committed), and state writes per event: the records the trigger tables' changelogs gained
  meanwhile (committed ones, read with a read_committed consumer: no transaction markers), per registration or
  completion, for the trigger states table and for all 4 trigger tables;
- weir's end of stream per client (agents/eof_*.py, clients through app.eof_gateway.Gateway, all at once): the
  filter stage alone (a deployment of one filter process, timed to its last report on the counter topic), the
  full pipeline (one filter, one controller, one group-by/aggregate, one joiner process; timed to the last client's report),
  batches/s of both, report latency after the client's last batch (p50/p99), and the EOF overhead ratio: full
  time / filter-alone time;
- weir's barrier (bench/barrier.py's steps, a new flows worker each run): exchanges/s arriving to wait, bytes
  per waiting exchange (the barrier's RocksDB files; its changelog's log segments on the broker), and release
  latency p50/p99 from the last completion to the record the step after the barrier sent;
- a tumbling window's sums on event time (bench/windows.py), one weir ``windows`` worker beside one Quix Streams
  process on the same records: records/s, CPU per record of the worker and of the broker, every window checked.

--profile DIR also records each weir worker with py-spy during the first backlog run (flame graph SVG and
collapsed stacks in DIR); give --orders enough for the backlog to outlast --profile-seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition

from bench import barrier, windows
from bench._util import (
    Collector,
    CpuMeter,
    Proc,
    broker_pid,
    end_offsets_total,
    group_settled,
    order,
    percentile,
    record,
    result_problem,
)
from bench.charts import FIGURES_FORMAT
from examples.eof_orders import JOB_SETTING as EOF_ORDERS_JOB
from examples.pricing import STEP as DEMO_STEP
from shop.catalogue import CATALOGUE_CENTS
from weir.app.eof_gateway import Gateway
from weir.app.kafka_io import delete_topics, ensure_topics
from weir.app.processes import ROOT, WorkerProcess
from weir.app.settings import default_bootstrap, load_settings
from weir.tables.eof import TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_REPORTS
from weir.tables.triggers import (
    DEFAULT_WAKE_TOPIC,
    OK,
    TRIGGERS_TOPIC,
    Message,
    completion_message,
    publish_trigger_messages,
    registration_message,
)

PARTITIONS = 4
#: The weir pipeline's workers in every figure: name -> agents. Each runs every stage on its share of the partitions,
#: as each of Quix Streams' and Kafka Streams' processes runs every stage of theirs.
WEIR_STAGES = {f"worker-{number}": "splitter,items,aggregator" for number in (1, 2, 3)}
#: --weir-layout roles: one process per role (one splitter+aggregator, two items), the layout of the figures before.
WEIR_ROLE_STAGES = {"split+agg": "splitter,aggregator", "items-1": "items", "items-2": "items"}
ITEMS = 10
#: The work each split/aggregate row does; rows of the same work are like with like (the same batching,
#: guarantee, commit interval and number of processes), the per-item row is Quix Streams' alone.
WORK_INLINE = f"inline: an order of {ITEMS} items -> one result, one stage"
WORK_STAGES = f"three stages, {ITEMS} items per record"
WORK_PER_ITEM = "three stages, one record per item (Quix Streams only)"
#: Quix Streams' forms (bench/quix_split_aggregate.py's BENCH_QUIX_FORM): section -> form.
QUIX_SECTIONS = {"quix-inline": "inline", "quix-chunks": "chunks", "quix-per-item": "per-item"}
#: Kafka Streams' forms (bench/kstreams/'s BENCH_KSTREAMS_FORM): section -> form.
KSTREAMS_SECTIONS = {"kstreams-inline": "inline", "kstreams-chunks": "chunks"}
#: Each pipeline's rows next to the rows of the same work.
SECTIONS = (
    "raw",
    "faust",
    "weir-inline",
    "quix-inline",
    "kstreams-inline",
    "aiokafka-inline",
    "weir",
    "quix-chunks",
    "kstreams-chunks",
    "quix-per-item",
    "weir-v1",
    "triggers",
    "eof",
    "barrier",
    "windows",
)
#: What a run without --only measures (weir-v1, the per_partition transactions of sessions 1-5, on request).
DEFAULT_SECTIONS = tuple(section for section in SECTIONS if section != "weir-v1")
#: Shorthands of --only: every Quix Streams form.
SECTION_GROUPS = {"quix": tuple(QUIX_SECTIONS), "kstreams": tuple(KSTREAMS_SECTIONS)}
#: weir with the item step inline (WEIR_ITEMS_INLINE): two splitter processes, nothing else.
INLINE_STAGES = {"splitter-1": "splitter", "splitter-2": "splitter"}
#: Its backlog runs are this many times --orders: it went through 10,000 orders in about 0.4 s.
INLINE_BACKLOG = 5
#: The counter trigger's tables (tables/trigger_tables.py); each has the changelog ``<prefix><table>-changelog``.
TRIGGER_TABLES = ("triggers", "triggers_fired", "trigger_sweep", "trigger_fired_deadlines")
EOF_LINES_PER_BATCH = 20


@dataclass
class Figure:
    """One row: a value per run, and the CPU of each process per run."""

    system: str
    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    cpu: list[dict[str, float]] = field(default_factory=list)
    fmt: str = "{:,.0f}"
    #: The split/aggregate work the row measures (WORK_*), empty for the other rows.
    work: str = ""

    def add(self, value: float, cpu: dict[str, float] | None = None) -> None:
        self.values.append(value)
        self.cpu.append(cpu or {})

    def median_cpu(self) -> dict[str, float]:
        """The CPU of the run that gave the median (the lower middle run of an even number)."""
        ordered = sorted(self.values)
        return self.cpu[self.values.index(ordered[(len(ordered) - 1) // 2])]

    def cells(self) -> list[str]:
        if not self.values:
            return ["-", "-", "-", "-"]
        ordered = sorted(self.values)
        cpu = cpu_text(self.median_cpu())
        return [self.fmt.format(ordered[0]), self.fmt.format(statistics.median(ordered)), self.fmt.format(ordered[-1]), cpu]

    def as_json(self) -> dict[str, Any]:
        """The row as numbers (bench/results.json): what the table shows, and every run's value and CPU."""
        row: dict[str, Any] = {"system": self.system, "name": self.name, "unit": self.unit, "values": self.values, "cpu": self.cpu}
        if self.work:
            row["work"] = self.work
        if self.values:
            row |= {"min": min(self.values), "median": statistics.median(self.values), "max": max(self.values)}
            row["median_cpu"] = self.median_cpu()
        return row


def cpu_text(cpu: dict[str, float]) -> str:
    """CPU per process as the tables show it: ``broker 33 · split+agg 73 · ...`` (% of one core)."""
    return " · ".join(f"{name} {percent:.0f}" for name, percent in cpu.items())


@dataclass
class Context:
    bootstrap: str
    run_id: str
    runs: int
    work_dir: Path
    broker: int | None
    figures: list[Figure] = field(default_factory=list)
    pipelines: list[PipelineFigures] = field(default_factory=list)
    #: notes of the sections that ran, under the table
    notes: list[str] = field(default_factory=list)
    #: orders every split/aggregate pipeline handles, at once, before its first measured run (--warm-up)
    warm_up: int = 20
    #: the three-stage weir pipeline's workers (--weir-layout): name -> agents
    weir_stages: dict[str, str] = field(default_factory=lambda: dict(WEIR_STAGES))

    def figure(self, system: str, name: str, unit: str, fmt: str = "{:,.0f}", work: str = "") -> Figure:
        created = Figure(system, name, unit, fmt=fmt, work=work)
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
            (produce, partial(_raw_produce, ctx.bootstrap, topic, count)),
            (consume, partial(_raw_consume, ctx.bootstrap, topic, count, None)),
            (consume_json, partial(_raw_consume, ctx.bootstrap, topic, count, json.loads)),
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
    """A running split/aggregate pipeline: where orders go, where results come from, its processes.

    ``work``: which rows it is like with like with (WORK_*); ``settings``: what it runs with, for the notes.
    """

    system: str
    orders_topic: str
    results_topic: str
    workers: dict[str, int]
    alive: Callable[[], None]
    work: str = ""
    settings: str = ""


@dataclass
class PipelineFigures:
    """A split/aggregate pipeline's main figures, for the like-with-like table."""

    pipeline: Pipeline
    orders_s: Figure
    workers_cpu: Figure
    cpu_per_order: Figure
    broker_cpu_per_order: Figure
    light_p99: Figure
    half_p99: Figure


def _checked_results(problems: list[str]) -> Callable[[ConsumerRecord[bytes, bytes]], str | None]:
    """The collector's key of a result, noting in ``problems`` a result that is not the order's expected aggregate."""

    def key_of(message: ConsumerRecord[bytes, bytes]) -> str | None:
        if message.key is None:
            return None
        key = message.key.decode()
        try:
            result = orjson.loads(message.value) if message.value is not None else None
        except orjson.JSONDecodeError as error:
            problems.append(f"result of order {key!r}: not JSON ({error})")
            return key
        problem = result_problem(key, result, ITEMS)
        if problem is not None:
            problems.append(problem)
        return key

    return key_of


async def orders_run(
    ctx: Context, pipeline: Pipeline, first: int, count: int, rate: float | None, *, during: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Sends ``count`` orders (all at once, or at ``rate``/s) and waits for their results, each checked against its
    order's catalogue total (:func:`bench._util.result_problem`)."""
    problems: list[str] = []
    collector = await Collector(ctx.bootstrap, pipeline.results_topic, key_of=_checked_results(problems)).start(from_end=True)
    producer = AIOKafkaProducer(bootstrap_servers=ctx.bootstrap, linger_ms=2)
    await producer.start()
    # The orders topic's metadata before the clock starts: a new producer's first send waits for it (the first
    # orders of a fixed-rate run measured that, not the pipeline)
    await producer.partitions_for(pipeline.orders_topic)
    # and a moment for the reader's and the sender's first requests: with the waits above alone, the first two orders of
    # a 20 orders/s run still took 100 ms in half the runs, their results committed within 5 ms (with this pause, none
    # did in 7 runs)
    await asyncio.sleep(0.5)
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
        if problems:
            raise RuntimeError(f"{pipeline.system}: {len(problems)} wrong results, the first: {'; '.join(problems[:3])}")
        finished = max(collector.seen[key] for key in keys)
        elapsed = finished - started_wall
        cpu = meter.stop()
        workers_seconds = sum(seconds for name, seconds in meter.seconds.items() if name in pipeline.workers)
        latencies = [collector.seen[key] - sent_at[key] for key in keys]
        return {
            "orders_per_s": count / elapsed,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * percentile(latencies, 0.99),
            "cpu": cpu,
            "cpu_ms_per_order": 1000 * workers_seconds / count,
            "broker_cpu_ms_per_order": 1000 * meter.seconds["broker"] / count if "broker" in meter.seconds else None,
            "latencies": latencies,
            "sent_at": sent_at,
            "seen": {key: collector.seen[key] for key in keys},
            "stamped": {key: collector.stamped[key] for key in keys},
            "placed": {key: collector.placed[key] for key in keys},
        }
    finally:
        await producer.stop()
        await collector.stop()


#: Seconds between the end of a run and the start of a fixed-rate run on the same pipeline.
SETTLE_S = 2.0


def _measure_pipeline(
    ctx: Context, pipeline: Pipeline, orders: int, rate: float, light_seconds: float, during_first: Callable[[], None] | None = None
) -> None:
    system = pipeline.system
    figure = partial(ctx.figure, system, work=pipeline.work)
    backlog = f"backlog of {orders:,} orders"
    orders_s = figure(f"{backlog}: orders/s", "orders/s", "{:,.1f}")
    items_s = figure(f"{backlog}: items/s", "items/s")
    # CPU seconds over the backlog run / orders: every worker process of the pipeline, and the broker apart.
    workers_cpu = figure(f"{backlog}: CPU of the workers, % of one core", "%")
    cpu_per_order = figure(f"{backlog}: CPU per order, the workers", "ms", "{:.3f}")
    broker_cpu_per_order = figure(f"{backlog}: CPU per order, the broker", "ms", "{:.3f}")
    p50 = figure(f"{backlog}: latency p50", "ms")
    p99 = figure(f"{backlog}: latency p99", "ms")
    light_count = int(rate * light_seconds)
    light = f"offered {rate:g} orders/s for {light_seconds:g} s"
    light_p50 = figure(f"{light}: latency p50", "ms")
    light_p99 = figure(f"{light}: latency p99", "ms")
    half = f"offered half the backlog rate for {light_seconds:g} s"
    half_rate = figure(f"{half}: rate offered", "orders/s", "{:,.1f}")
    half_p50 = figure(f"{half}: latency p50", "ms")
    half_p99 = figure(f"{half}: latency p99", "ms")
    ctx.pipelines.append(PipelineFigures(pipeline, orders_s, workers_cpu, cpu_per_order, broker_cpu_per_order, light_p99, half_p99))
    # Warm-up, the same for every system: every stage has handled ctx.warm_up orders, sent at once, before the clock
    # starts (a JVM's JIT compiles the hot paths, every changelog and repartition partition has been written).
    asyncio.run(orders_run(ctx, pipeline, 0, ctx.warm_up, None))
    first = ctx.warm_up
    for run in range(ctx.runs):
        figures = asyncio.run(orders_run(ctx, pipeline, first, orders, None, during=during_first if run == 0 else None))
        first += orders
        orders_s.add(figures["orders_per_s"], figures["cpu"])
        items_s.add(figures["orders_per_s"] * ITEMS, figures["cpu"])
        workers_cpu.add(sum(percent for name, percent in figures["cpu"].items() if name in pipeline.workers), figures["cpu"])
        cpu_per_order.add(figures["cpu_ms_per_order"], figures["cpu"])
        if figures["broker_cpu_ms_per_order"] is not None:
            broker_cpu_per_order.add(figures["broker_cpu_ms_per_order"], figures["cpu"])
        p50.add(figures["p50_ms"], figures["cpu"])
        p99.add(figures["p99_ms"], figures["cpu"])
        half_of_max = figures["orders_per_s"] / 2
        time.sleep(SETTLE_S)
        figures = asyncio.run(orders_run(ctx, pipeline, first, light_count, rate))
        first += light_count
        light_p50.add(figures["p50_ms"], figures["cpu"])
        light_p99.add(figures["p99_ms"], figures["cpu"])
        print(f"  {system}, {light}: {_slowest(figures)}", flush=True)
        # The "half the maximum rate": half of what this run's backlog sustained.
        half_count = int(half_of_max * light_seconds)
        time.sleep(SETTLE_S)
        figures = asyncio.run(orders_run(ctx, pipeline, first, half_count, half_of_max))
        first += half_count
        half_rate.add(half_of_max, figures["cpu"])
        half_p50.add(figures["p50_ms"], figures["cpu"])
        half_p99.add(figures["p99_ms"], figures["cpu"])


def _slowest(figures: dict[str, Any], count: int = 3) -> str:
    """Where the slowest orders of a run spent their time: from the send to the result's create time (the worker
    made it: fetch, processing, the batch's flush) and from there to the reader (the commit, the marker, the fetch)."""
    sent, seen, stamped = figures["sent_at"], figures["seen"], figures["stamped"]
    slowest = sorted(sent, key=lambda key: seen[key] - sent[key], reverse=True)[:count]
    parts = []
    for key in slowest:
        total, made, after = seen[key] - sent[key], stamped[key] - sent[key], seen[key] - stamped[key]
        parts.append(f"{1000 * total:,.0f} ms (made at +{1000 * made:,.0f}, seen {1000 * after:,.0f} later)")
    return "slowest " + ", ".join(parts)


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
        # Collapsed stacks of every worker; a flame graph of the first only: two
        # samplers on one process would double the pauses py-spy makes in it.
        for number, (name, pid) in enumerate(workers.items()):
            for fmt, suffix in (("raw", "txt"), ("flamegraph", "svg"))[: 2 if number == 0 else 1]:
                output = out_dir / f"{name}.{suffix}"
                command = [py_spy, "record", "--pid", str(pid), "--duration", str(seconds), "--format", fmt, "-o", str(output)]
                with Path(f"{output}.log").open("wb") as log:  # the child keeps its own copy of the descriptor
                    subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)

    return start


@contextlib.contextmanager
def weir_pipeline(
    ctx: Context,
    label: str,
    prefix: str,
    extra_env: dict[str, str] | None = None,
    trace_files: dict[str, Path] | None = None,
    stages: dict[str, str] | None = None,
    *,
    work: str = WORK_STAGES,
) -> Iterator[Pipeline]:
    """The split/aggregate pipeline's workers on new topics ``<prefix>*``, exactly_once: ``stages`` names each
    worker and its agents (default :data:`WEIR_STAGES`: three, each running every stage). ``extra_env``
    adds to their environment, ``trace_files`` names a WEIR_TRACE_FILE per worker. Stopped on leaving."""
    env = {
        "WEIR_ITEM_PROCESSOR": DEMO_STEP,  # the work every system does: price each item from the catalogue
        **os.environ,
        "WEIR_TOPIC_PREFIX": prefix,
        "WEIR_APP_ID": prefix.rstrip(".").replace(".", "-"),
        "WEIR_GUARANTEE": "exactly_once",
        **(extra_env or {}),
    }
    names = [f"{prefix}{name}" for name in ("orders", "items", "item-results", "aggregates", "dead-letters")]
    asyncio.run(ensure_topics(ctx.bootstrap, names, PARTITIONS))
    workers = {
        name: WorkerProcess(
            agents,
            {
                **env,
                "WEIR_DATA_DIR": str(ctx.work_dir / f"weir-data-{name}"),
                **({"WEIR_TRACE_FILE": str(trace_files[name])} if trace_files and name in trace_files else {}),
            },
            ctx.work_dir / f"weir-{name}.log",
            _free_port(),
        )
        for name, agents in (stages or WEIR_STAGES).items()
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

        weir = load_settings()  # what the workers read from the same environment, but for extra_env
        settings = (
            f"exactly_once ({env.get('WEIR_TRANSACTIONS', weir.transactions)} transactions), commit interval {weir.commit_interval:g} s"
            f" (and after {weir.commit_idle_ms} ms idle), batches of up to {weir.batch_size} events ({weir.batch_wait_ms} ms),"
            f" chunks of {weir.split_chunk} items, bundles of {weir.bundle}, producer linger {weir.producer_linger_ms} ms"
        )
        yield Pipeline(label, f"{prefix}orders", f"{prefix}aggregates", pids, alive, work, settings)
    finally:
        for worker in workers.values():
            worker.stop()


def run_weir(
    ctx: Context,
    orders: int,
    rate: float,
    light_seconds: float,
    profile: Path | None,
    profile_seconds: int,
    transactions: str | None = None,
    *,
    inline: bool = False,
) -> None:
    """The split/aggregate pipeline; ``transactions``: WEIR_TRANSACTIONS for its workers (None: the default);
    ``inline``: the item step run by the splitter (WEIR_ITEMS_INLINE), in :data:`INLINE_STAGES`."""
    variant = "inline" if inline else transactions
    label = "weir" if variant is None else "weir, items inline" if inline else f"weir, {transactions} transactions"
    prefix = f"cmp-{ctx.run_id}.{'weir' if variant is None else 'weir-' + variant}."
    extra_env = {"WEIR_ITEMS_INLINE": "1"} if inline else {} if transactions is None else {"WEIR_TRANSACTIONS": transactions}
    backlog = orders * INLINE_BACKLOG if inline else orders
    stages, work = (INLINE_STAGES, WORK_INLINE) if inline else (ctx.weir_stages, WORK_STAGES)
    with weir_pipeline(ctx, label, prefix, extra_env, stages=stages, work=work) as pipeline:
        _measure_pipeline(ctx, pipeline, backlog, rate, light_seconds, _profiler(pipeline.workers, profile, profile_seconds))


#: Quix Streams' forms: form -> (system label, work, processes). As many processes, in one consumer group, as
#: weir runs workers for the same work; the per-item form as many as weir's three stages.
QUIX_FORMS = {
    "inline": ("Quix Streams, inline", WORK_INLINE, len(INLINE_STAGES)),
    "chunks": (f"Quix Streams, chunks of {ITEMS}", WORK_STAGES, len(WEIR_STAGES)),
    "per-item": ("Quix Streams, one record per item", WORK_PER_ITEM, len(WEIR_STAGES)),
}


def run_quix(ctx: Context, form: str, orders: int, rate: float, light_seconds: float) -> None:
    """bench/quix_split_aggregate.py in ``form``, its processes in one consumer group, with weir's commit interval,
    chunk size and producer linger (as the weir workers' environment sets them)."""
    label, work, processes = QUIX_FORMS[form]
    weir = load_settings()
    chunk = "the whole order" if form == "inline" else "1 item" if form == "per-item" else f"{weir.split_chunk} items"
    settings = (
        f"exactly-once, commit interval {weir.commit_interval:g} s, records of {chunk},"
        f" producer linger.ms {weir.producer_linger_ms}, consumer poll timeout 1 s (Quix's default), one record at a time"
    )
    backlog = orders * INLINE_BACKLOG if form == "inline" else orders
    extra = {"BENCH_QUIX_FORM": form, "BENCH_SPLIT_CHUNK": str(weir.split_chunk)}
    command = [sys.executable, "-m", "bench.quix_split_aggregate"]
    _run_processes(ctx, f"quix-{form}", command, "quix", extra, (label, work, settings), processes, backlog, rate, light_seconds)


#: Kafka Streams' forms: form -> (system, work, processes), as many processes as weir's workers for the same work.
KSTREAMS_FORMS = {
    "inline": ("Kafka Streams, inline", WORK_INLINE, len(INLINE_STAGES)),
    "chunks": (f"Kafka Streams, chunks of {ITEMS}", WORK_STAGES, len(WEIR_STAGES)),
}


def run_kstreams(ctx: Context, form: str, orders: int, rate: float, light_seconds: float) -> None:
    """bench/kstreams/ (Java) in ``form``, its processes in one application id, with weir's commit interval, chunk size
    and producer linger; exactly-once v2, one stream thread per process."""
    from bench import kstreams

    label, work, processes = KSTREAMS_FORMS[form]
    weir = load_settings()
    chunk = "the whole order" if form == "inline" else f"{weir.split_chunk} items"
    settings = (
        f"Kafka Streams 4.1.1, exactly_once_v2, commit interval {weir.commit_interval:g} s, records of {chunk},"
        f" producer linger.ms {weir.producer_linger_ms}, one stream thread per process, Java 17, heap 1 GiB"
    )
    backlog = orders * INLINE_BACKLOG if form == "inline" else orders
    extra = {
        "BENCH_KSTREAMS_FORM": form,
        "BENCH_SPLIT_CHUNK": str(weir.split_chunk),
        "BENCH_CATALOGUE": orjson.dumps(CATALOGUE_CENTS).decode(),
    }
    shape = (label, work, settings)
    _run_processes(ctx, f"kstreams-{form}", kstreams.command(), "kstreams", extra, shape, processes, backlog, rate, light_seconds)


def run_aiokafka_inline(ctx: Context, orders: int, rate: float, light_seconds: float) -> None:
    """bench/aiokafka_floor.py: the inline work on aiokafka alone (no Faust, no weir), as many processes as the other inline rows."""
    weir = load_settings()
    settings = (
        f"a transactional producer, read_committed, offsets in each transaction, commit interval {weir.commit_interval:g} s"
        f" and when nothing is ready, batches of up to {weir.batch_size} records, producer linger {weir.producer_linger_ms} ms;"
        " nothing else (no tables, no dead letters, no retries, no Faust): the floor of aiokafka's pure-Python client"
    )
    extra = {"BENCH_BATCH_SIZE": str(weir.batch_size)}
    shape = ("aiokafka alone, inline", WORK_INLINE, settings)
    _run_processes(
        ctx,
        "aiokafka-inline",
        [sys.executable, "-m", "bench.aiokafka_floor"],
        "aiokafka-inline",
        extra,
        shape,
        len(INLINE_STAGES),
        orders * INLINE_BACKLOG,
        rate,
        light_seconds,
    )


def _run_processes(
    ctx: Context,
    name: str,
    command: list[str],
    process: str,
    extra: dict[str, str],
    shape: tuple[str, str, str],
    processes: int,
    backlog: int,
    rate: float,
    light_seconds: float,
) -> None:
    """``processes`` copies of ``command``, named ``<process>-<n>``, in one consumer group on new topics;
    ``shape``: (system, work, settings)."""
    weir = load_settings()
    prefix = f"cmp-{ctx.run_id}.{name}."
    orders_topic, items_topic, results_topic = f"{prefix}orders", f"{prefix}items", f"{prefix}aggregates"
    asyncio.run(ensure_topics(ctx.bootstrap, [orders_topic, items_topic, results_topic], PARTITIONS))
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": ctx.bootstrap,
        "BENCH_APP_ID": f"cmp-{ctx.run_id}-{name}",
        "BENCH_ORDERS": orders_topic,
        "BENCH_ITEMS": items_topic,
        "BENCH_AGGREGATES": results_topic,
        "BENCH_PARTITIONS": str(PARTITIONS),
        "BENCH_COMMIT_INTERVAL": str(weir.commit_interval),
        "BENCH_PRODUCER_LINGER_MS": str(weir.producer_linger_ms),
        **extra,
    }
    names = [f"{process}-{number}" for number in range(1, processes + 1)]
    workers = {
        worker: Proc(
            command,
            {**env, "BENCH_STATE_DIR": str(ctx.work_dir / f"{name}-state-{worker}")},
            ctx.work_dir / f"{name}-{worker}.log",
        ).start()
        for worker in names
    }

    def alive() -> None:
        for worker in workers.values():
            worker.check_alive()

    try:
        pids = {worker: proc.pid for worker, proc in workers.items()}
        asyncio.run(group_settled(ctx.bootstrap, env["BENCH_APP_ID"], processes, alive=alive))
        system, work, settings = shape
        pipeline = Pipeline(system, orders_topic, results_topic, pids, alive, work, settings)
        _measure_pipeline(ctx, pipeline, backlog, rate, light_seconds)
    finally:
        for worker in workers.values():
            worker.stop()


# --- weir's counter trigger ----------------------------------------------------------------------------------


def _weir_worker(ctx: Context, agents: str, name: str, env: dict[str, str]) -> WorkerProcess:
    """A started weir worker (not waited for) with its own data dir and log in the run's work dir."""
    env = {**env, "WEIR_DATA_DIR": str(ctx.work_dir / f"{name}-data")}
    return WorkerProcess(agents, env, ctx.work_dir / f"{name}.log", _free_port()).start()


def _alive(workers: dict[str, WorkerProcess]) -> Callable[[], None]:
    def check() -> None:
        for worker in workers.values():
            if worker.process is not None and worker.process.poll() is not None:
                raise RuntimeError(f"weir worker {worker.agents} exited ({worker.log_path}):\n{worker.log_text()[-3000:]}")

    return check


def _pids(workers: dict[str, WorkerProcess]) -> dict[str, int]:
    return {name: worker.process.pid for name, worker in workers.items() if worker.process is not None}


async def _committed_ends(bootstrap: str, topics: list[str]) -> dict[TopicPartition, int]:
    """Each partition's last stable offset (end offset as a read_committed consumer sees it)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    await consumer.start()
    try:
        ends: dict[TopicPartition, int] = await consumer.end_offsets(
            [TopicPartition(topic, p) for topic in topics for p in range(PARTITIONS)]
        )
        return ends
    finally:
        await consumer.stop()


async def _committed_records(bootstrap: str, start: dict[TopicPartition, int], end: dict[TopicPartition, int]) -> dict[str, int]:
    """Records of committed transactions between ``start`` and ``end`` offsets, per topic (markers and aborted records not counted)."""
    counts = {tp.topic: 0 for tp in end}
    wanted = {tp: offset for tp, offset in end.items() if offset > start[tp]}
    if not wanted:
        return counts
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed")
    await consumer.start()
    try:
        consumer.assign(list(wanted))
        for tp in wanted:
            consumer.seek(tp, start[tp])
        deadline = time.monotonic() + 60
        while [tp for tp, offset in wanted.items() if await consumer.position(tp) < offset]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"changelogs not read up to {wanted} after 60 s")
            batch = await consumer.getmany(timeout_ms=200, max_records=20_000)
            for tp, messages in batch.items():
                counts[tp.topic] += sum(1 for message in messages if message.offset < wanted[tp])
        return counts
    finally:
        await consumer.stop()


def _trigger_backlog(tag: str, parents: int, children: int, seed: int) -> tuple[list[str], list[Message]]:
    """Parents ``<tag>-p<n>`` with ``children`` children each: every registration, then every completion (shuffled)."""
    rng = random.Random(seed)
    ids = [f"{tag}-p{number}" for number in range(parents)]
    completions = [
        completion_message(parent, f"{parent}-c{child}", OK if rng.random() >= 0.1 else "failed")
        for parent in ids
        for child in range(children)
    ]
    rng.shuffle(completions)
    return ids, [registration_message(parent, children) for parent in ids] + completions


async def _triggers_run(
    ctx: Context, prefix: str, workers: dict[str, WorkerProcess], parent_ids: list[str], messages: list[Message]
) -> dict[str, Any]:
    """Sends the backlog; seconds until every parent fired (its wake read read_committed), changelog records meanwhile."""
    changelogs = [f"{prefix}{table}-changelog" for table in TRIGGER_TABLES]
    collector = await Collector(ctx.bootstrap, prefix + DEFAULT_WAKE_TOPIC).start()
    try:
        before = await _committed_ends(ctx.bootstrap, changelogs)
        meter = ctx.meter(_pids(workers)).start()
        started = time.time()
        await publish_trigger_messages(ctx.bootstrap, prefix, messages)
        done = await collector.wait_for(parent_ids, timeout_s=600, alive=_alive(workers))
        cpu = meter.stop()
        after = await _committed_ends(ctx.bootstrap, changelogs)
        if not done:
            missing = len(set(parent_ids) - collector.seen.keys())
            raise TimeoutError(f"triggers: {missing} of {len(parent_ids)} parents not fired after 600 s")
        elapsed = max(collector.seen[parent] for parent in parent_ids) - started
        writes = await _committed_records(ctx.bootstrap, before, after)
        return {"seconds": elapsed, "writes": writes, "cpu": cpu}
    finally:
        await collector.stop()


def run_triggers(ctx: Context, parents: int, children: int) -> None:
    prefix = f"cmp-{ctx.run_id}.triggers."
    env = {**os.environ, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": f"cmp-{ctx.run_id}-triggers", "WEIR_GUARANTEE": "exactly_once"}
    asyncio.run(ensure_topics(ctx.bootstrap, [prefix + TRIGGERS_TOPIC, prefix + DEFAULT_WAKE_TOPIC], PARTITIONS))
    events = parents * (children + 1)
    backlog = f"backlog of {parents:,} parents, {children} children each"
    rate = ctx.figure("weir triggers", f"{backlog}: completion events/s", "events/s")
    states = ctx.figure("weir triggers", f"{backlog}: state writes per event, trigger states table", "records", "{:.3f}")
    tables = ctx.figure("weir triggers", f"{backlog}: state writes per event, all 4 trigger tables", "records", "{:.3f}")
    workers = {"triggers": _weir_worker(ctx, "triggers", "triggers", env)}
    try:
        workers["triggers"].wait_ready()
        asyncio.run(ensure_topics(ctx.bootstrap, [f"{prefix}{table}-changelog" for table in TRIGGER_TABLES], PARTITIONS))
        # Warm-up: the worker has fired a few parents (every table written) before the clock starts.
        asyncio.run(_triggers_run(ctx, prefix, workers, *_trigger_backlog("warm", 20, children, seed=0)))
        for run in range(ctx.runs):
            figures = asyncio.run(_triggers_run(ctx, prefix, workers, *_trigger_backlog(f"run{run}", parents, children, seed=run + 1)))
            rate.add(parents * children / figures["seconds"], figures["cpu"])
            states.add(figures["writes"][f"{prefix}triggers-changelog"] / events, figures["cpu"])
            tables.add(sum(figures["writes"].values()) / events, figures["cpu"])
    finally:
        for worker in workers.values():
            worker.stop()


# --- weir's end of stream per client -------------------------------------------------------------------------


def _eof_clients(tag: str, clients: int, batches: int) -> dict[str, list[str]]:
    """Clients ``<tag>-c<n>``, each with ``batches`` full batches of order lines (about 1 in 10 outside opening hours)."""
    rng = random.Random(tag)
    flavours = sorted(CATALOGUE_CENTS)
    data = {}
    for number in range(clients):
        client = f"{tag}-c{number}"
        lines = []
        for line in range(batches * EOF_LINES_PER_BATCH):
            clock = "23:30" if rng.random() < 0.1 else f"{rng.randint(10, 21):02d}:{rng.randint(0, 59):02d}"
            items = [{"flavour": rng.choice(flavours), "scoops": rng.randint(1, 3)} for _ in range(rng.randint(1, 3))]
            lines.append(orjson.dumps({"order_id": f"{client}-{line}", "time": clock, "items": items}).decode())
        data[client] = lines
    return data


def _filtered_key(message: ConsumerRecord[bytes, bytes]) -> str | None:
    """``<client>/<batch id>`` of a filter's report on the counter topic (the filter stage's output), None for the rest."""
    value = orjson.loads(message.value) if message.value else None
    if isinstance(value, dict) and value.get("kind") == "filtered":
        return f"{value['client']}/{value['batch_id']}"
    return None


async def _eof_run(
    ctx: Context, prefix: str, workers: dict[str, WorkerProcess], clients: dict[str, list[str]], full: bool
) -> dict[str, Any]:
    """Every client sends its batches and its end at once. Filter alone: seconds until the filter reported every batch.

    Full pipeline: seconds until every client's report arrived, each report's latency after its client's last batch,
    and the seconds from the filter's report of the last batch to the last report (the end-of-stream handshake's tail).
    """
    batches = len(next(iter(clients.values()))) // EOF_LINES_PER_BATCH
    filtered_keys = [f"{client}/{batch}" for client in clients for batch in range(batches)]
    filtered = await Collector(ctx.bootstrap, prefix + TOPIC_COUNTER, key_of=_filtered_key).start()
    if full:
        watch = await Collector(ctx.bootstrap, prefix + TOPIC_REPORTS).start()
        wanted = list(clients)
    else:
        watch, wanted = filtered, filtered_keys
    ended: dict[str, float] = {}
    try:
        async with Gateway(ctx.bootstrap, lambda name: prefix + name, partitions=PARTITIONS) as gateway:
            meter = ctx.meter(_pids(workers)).start()
            started = time.time()

            async def client_run(client: str, lines: list[str]) -> None:
                await gateway.send(client, lines, batch_size=EOF_LINES_PER_BATCH)
                ended[client] = time.time()  # its last batch and its end are acknowledged by the broker
                if full:
                    report = await gateway.report(client, timeout_s=600)  # then says "delivered": the controller cleans it up
                    if report.get("status") != "complete":
                        raise RuntimeError(f"eof: client {client} got an incomplete report: {report}")

            await asyncio.gather(*(client_run(client, lines) for client, lines in clients.items()))
            done = await watch.wait_for(wanted, timeout_s=600, alive=_alive(workers))
            cpu = meter.stop()
            done = done and await filtered.wait_for(filtered_keys, timeout_s=60)
        if not done:
            missing = len(set(wanted) - watch.seen.keys()) or len(set(filtered_keys) - filtered.seen.keys())
            raise TimeoutError(f"eof: {missing} of {len(wanted)} {'reports' if full else 'filtered batches'} missing after 600 s")
        latencies = [watch.seen[client] - ended[client] for client in clients] if full else []
        last = max(watch.seen[key] for key in wanted)
        return {"seconds": last - started, "latencies": latencies, "tail": last - max(filtered.seen.values()), "cpu": cpu}
    finally:
        await watch.stop()
        if watch is not filtered:
            await filtered.stop()


def run_eof(ctx: Context, clients: int, batches: int) -> None:
    total = clients * batches
    load = f"{clients} clients, {batches} batches of {EOF_LINES_PER_BATCH} lines each"
    alone = ctx.figure("weir EOF", f"{load}: filter stage alone, batches/s", "batches/s")
    full = ctx.figure("weir EOF", f"{load}: to every client's report, batches/s", "batches/s")
    p50 = ctx.figure("weir EOF", f"{load}: report latency after the client's last batch, p50", "ms")
    p99 = ctx.figure("weir EOF", f"{load}: report latency after the client's last batch, p99", "ms")
    ratio = ctx.figure("weir EOF", f"{load}: EOF overhead ratio (to every report / filter alone)", "ratio", "{:.2f}")
    tail = ctx.figure("weir EOF", f"{load}: the last report after the filter's report of the last batch", "ms")
    filter_seconds: list[float] = []
    phases = {
        "filter alone": {"filter": "eof_filter"},
        "full": {"filter": "eof_filter", "controller": "eof_controller", "aggregator": "eof_aggregator", "joiner": "eof_joiner"},
    }
    for phase, stages in phases.items():
        tag = "alone" if phase == "filter alone" else "full"
        prefix = f"cmp-{ctx.run_id}.eof-{tag}."
        env = {
            "WEIR_EOF_JOB": EOF_ORDERS_JOB,  # the ice-cream order lines the clients send
            **os.environ,
            "WEIR_TOPIC_PREFIX": prefix,
            "WEIR_APP_ID": f"cmp-{ctx.run_id}-eof-{tag}",
            "WEIR_GUARANTEE": "exactly_once",
        }
        asyncio.run(ensure_topics(ctx.bootstrap, [prefix + name for name in (TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_REPORTS)], PARTITIONS))
        workers = {name: _weir_worker(ctx, agents, f"eof-{tag}-{name}", env) for name, agents in stages.items()}
        try:
            for worker in workers.values():
                worker.wait_ready()
            # Warm-up: every stage has handled a client before the clock starts.
            asyncio.run(_eof_run(ctx, prefix, workers, _eof_clients("warm", 2, 2), full=tag == "full"))
            for run in range(ctx.runs):
                figures = asyncio.run(_eof_run(ctx, prefix, workers, _eof_clients(f"run{run}", clients, batches), full=tag == "full"))
                if tag == "alone":
                    filter_seconds.append(figures["seconds"])
                    alone.add(total / figures["seconds"], figures["cpu"])
                    continue
                full.add(total / figures["seconds"], figures["cpu"])
                p50.add(1000 * statistics.median(figures["latencies"]), figures["cpu"])
                p99.add(1000 * percentile(figures["latencies"], 0.99), figures["cpu"])
                ratio.add(figures["seconds"] / filter_seconds[run], figures["cpu"])
                tail.add(1000 * figures["tail"], figures["cpu"])
        finally:
            for worker in workers.values():
                worker.stop()


# --- weir's barrier (flows) ----------------------------------------------------------------------------------


def run_barrier(ctx: Context, waiting: int, released: int, rate: float) -> None:
    system = "weir barrier"
    arrive = ctx.figure(system, f"{waiting:,} exchanges arrive and wait: exchanges/s", "exch/s")
    arrive_cpu = ctx.figure(system, f"{waiting:,} exchanges arrive and wait: CPU per exchange, the worker", "ms", "{:.3f}")
    rocksdb = ctx.figure(system, f"{waiting:,} waiting: bytes per waiting exchange, RocksDB", "bytes")
    changelog = ctx.figure(system, f"{waiting:,} waiting: bytes per waiting exchange, broker changelog", "bytes")
    light = f"{released} released at {rate:g}/s"
    p50 = ctx.figure(system, f"{light}: release latency p50", "ms")
    p99 = ctx.figure(system, f"{light}: release latency p99", "ms")
    for run in range(ctx.runs):
        # A new worker on new topics each run: the bytes are those of a barrier holding just these exchanges.
        prefix = f"cmp-{ctx.run_id}.barrier{run}."
        work_dir = ctx.work_dir / f"barrier-{run}"
        work_dir.mkdir()
        worker = barrier.start_worker(ctx.bootstrap, PARTITIONS, prefix, f"cmp-{ctx.run_id}-barrier{run}", work_dir, _free_port())
        try:
            workers = {"flows": worker}
            meter = ctx.meter(_pids(workers)).start()
            count, seconds = barrier.fill(ctx.bootstrap, prefix, [f"w-{number}" for number in range(waiting)], timeout_s=600)
            cpu = meter.stop()
            _alive(workers)()
            if count < waiting:
                raise TimeoutError(f"barrier: {count} of {waiting} exchanges waiting after 600 s")
            on_disk, segments = barrier.disk_bytes(prefix, work_dir / "data")
            arrive.add(count / seconds, cpu)
            arrive_cpu.add(1000 * meter.seconds["flows"] / count, cpu)
            rocksdb.add(on_disk / count, cpu)
            changelog.add(segments / count, cpu)
            meter = ctx.meter(_pids(workers)).start()
            latencies = barrier.release(ctx.bootstrap, prefix, [f"r-{number}" for number in range(released)], rate)
            cpu = meter.stop()
            _alive(workers)()
            if len(latencies) < released:
                raise TimeoutError(f"barrier: {released - len(latencies)} of {released} exchanges not released after 300 s")
            p50.add(1000 * statistics.median(latencies), cpu)
            p99.add(1000 * percentile(latencies, 0.99), cpu)
        finally:
            worker.stop()


# --- the table ---------------------------------------------------------------------------------------------


def run_windows(ctx: Context, records: int, sensors: int) -> None:
    """bench/windows.py: a tumbling window's sums on event time, one weir ``windows`` worker beside one Quix Streams
    process, on new topics each run, the same records (checked window by window)."""
    weir = load_settings()
    systems = {
        "weir": f"exactly_once ({weir.transactions} transactions), commit interval {weir.commit_interval:g} s, batches of up to"
        f" {weir.batch_size} events, producer linger {weir.producer_linger_ms} ms",
        "Quix Streams": f"exactly-once, commit interval {weir.commit_interval:g} s, producer linger.ms {weir.producer_linger_ms},"
        ' final(closing_strategy="partition"), its other defaults',
    }
    label = f"tumbling window {windows.WINDOW_MS // 1000} s (grace {windows.GRACE_MS // 1000} s), {records:,} records, {sensors} keys"
    figures = {
        system: (
            ctx.figure(system, f"{label}: records/s", "records/s"),
            ctx.figure(system, f"{label}: CPU per record, the worker", "ms", fmt="{:.3f}"),
            ctx.figure(system, f"{label}: CPU per record, the broker", "ms", fmt="{:.3f}"),
        )
        for system in systems
    }
    for number in range(ctx.runs):
        run = windows.work(records, sensors)  # an hour before now: the broker's retention keeps every record of the run
        for system in systems:
            name = f"windows-{'weir' if system == 'weir' else 'quix'}-{number}"
            prefix = f"cmp-{ctx.run_id}.{name}."
            source, results = f"{prefix}readings", f"{prefix}sums"
            asyncio.run(windows.create_topics(ctx.bootstrap, [source, results, f"{prefix}dead-letters"]))
            if system == "weir":
                env = {
                    **os.environ,
                    "KAFKA_BOOTSTRAP": ctx.bootstrap,
                    "WEIR_TOPIC_PREFIX": prefix,
                    "WEIR_APP_ID": prefix.rstrip(".").replace(".", "-"),
                    "WEIR_GUARANTEE": "exactly_once",
                    "WEIR_WINDOWS": "bench.windows",
                }
                worker: Any = _weir_worker(ctx, "windows", name, env)
                worker.wait_ready()
                pid = worker.process.pid
                alive = _alive({name: worker})
            else:
                env = {
                    **os.environ,
                    "KAFKA_BOOTSTRAP": ctx.bootstrap,
                    "BENCH_APP_ID": prefix.rstrip(".").replace(".", "-"),
                    "BENCH_SOURCE": source,
                    "BENCH_RESULTS": results,
                    "BENCH_STATE_DIR": windows.state_dir(ctx.work_dir, name),
                    "BENCH_COMMIT_INTERVAL": str(weir.commit_interval),
                    "BENCH_PRODUCER_LINGER_MS": str(weir.producer_linger_ms),
                }
                worker = Proc(windows.quix_command(), env, ctx.work_dir / f"{name}.log").start()
                pid = worker.pid
                alive = worker.check_alive
            try:
                meter = ctx.meter({"worker": pid})
                took, cpu = asyncio.run(windows.measure(ctx.bootstrap, source, results, run, meter, alive))
            finally:
                worker.stop()
            rate, per_worker, per_broker = figures[system]
            rate.add(records / took, cpu)
            per_worker.add(1000 * meter.seconds.get("worker", 0.0) / records, cpu)
            per_broker.add(1000 * meter.seconds.get("broker", 0.0) / records, cpu)
            print(f"  windows {system} run {number + 1}: {records / took:,.0f} records/s, every window's result right", flush=True)
    ctx.notes.append(
        "windows (bench/windows.py): one process each, the same records each run; "
        + "; ".join(f"{system}: {settings}" for system, settings in systems.items())
        + ". Records/s: from the first send of the records (both warm: a window per partition closed before) until every"
        " window's final result is read by a read_committed consumer; every result checked (sum, count), none twice."
    )


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


def _median_text(figure: Figure) -> str:
    return figure.fmt.format(statistics.median(figure.values)) if figure.values else "-"


def like_with_like(ctx: Context) -> list[str]:
    """The split/aggregate pipelines, those doing the same work side by side: medians, CPU per order, settings."""
    if not ctx.pipelines:
        return []
    works = list(dict.fromkeys(row.pipeline.work for row in ctx.pipelines))
    rows = sorted(ctx.pipelines, key=lambda row: works.index(row.pipeline.work))
    header = [
        "work",
        "system",
        "processes",
        "backlog orders/s",
        "workers' CPU, % of one core",
        "CPU per order, workers, ms",
        "CPU per order, broker, ms",
        f"p99 at {rows[0].light_p99.name.split(':')[0].removeprefix('offered ')}, ms",
        "p99 at half the backlog rate, ms",
    ]
    lines = [
        "Like with like: each split/aggregate pipeline next to those doing the same work, with the same number of processes,"
        " exactly-once and the same commit interval (medians; the full table below).",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if number < 2 else "---:" for number in range(len(header))) + "|",
    ]
    for row in rows:
        figures = (row.orders_s, row.workers_cpu, row.cpu_per_order, row.broker_cpu_per_order, row.light_p99, row.half_p99)
        cells = [row.pipeline.work, row.pipeline.system, str(len(row.pipeline.workers)), *(_median_text(figure) for figure in figures)]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {row.pipeline.system}: {row.pipeline.settings}." for row in rows]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one run of each, smaller loads (a smoke test, about 5 minutes)")
    parser.add_argument("--runs", type=int, help="runs of each figure (default 3, 1 with --quick)")
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=f"comma list of {', '.join(SECTIONS)}; 'quix' is every Quix Streams form, 'kstreams' every Kafka Streams one"
        " (default: all but weir-v1)",
    )
    parser.add_argument("--raw-messages", type=int, help="messages per raw aiokafka run (default 100,000; 30,000 with --quick)")
    parser.add_argument("--faust-messages", type=int, help="messages per plain Faust run (default 20,000; 5,000 with --quick)")
    parser.add_argument("--orders", type=int, help="orders of 10 items per backlog run (default 10,000; 300 with --quick)")
    parser.add_argument(
        "--warm-up", type=int, help="orders every split/aggregate pipeline handles before it is measured (default 2,000; 300 with --quick)"
    )
    parser.add_argument("--rate", type=float, default=20.0, help="orders/s offered in the fixed-rate runs")
    parser.add_argument("--light-seconds", type=float, help="length of a fixed-rate run (default 10 s; 5 s with --quick)")
    parser.add_argument("--trigger-parents", type=int, help="parents per counter-trigger backlog run (default 1,000; 300 with --quick)")
    parser.add_argument("--trigger-children", type=int, default=10, help="children (completion events) per parent")
    parser.add_argument("--eof-clients", type=int, help="clients per EOF run (default 20; 8 with --quick)")
    parser.add_argument(
        "--eof-batches", type=int, help=f"batches of {EOF_LINES_PER_BATCH} lines per EOF client (default 200; 15 with --quick)"
    )
    parser.add_argument(
        "--barrier-waiting",
        type=int,
        help="exchanges left waiting per barrier run (default 20,000: the rate is the worker's, not its first fetches'; 500 with --quick)",
    )
    parser.add_argument("--barrier-released", type=int, help="exchanges released per barrier run (default 150; 60 with --quick)")
    parser.add_argument("--barrier-rate", type=float, default=30.0, help="payments/s (the last completions) in the barrier release run")
    parser.add_argument("--window-records", type=int, help="records per windows run (default 100,000; 20,000 with --quick)")
    parser.add_argument("--window-keys", type=int, default=200, help="keys (sensors) of the windows runs")
    parser.add_argument(
        "--weir-layout",
        choices=("shared", "roles"),
        default="shared",
        help="weir's three-stage workers: three that each run every stage (default), or one splitter+aggregator and two items",
    )
    parser.add_argument("--profile", type=Path, help="record the weir workers with py-spy during the first backlog run, into DIR")
    parser.add_argument("--profile-seconds", type=int, default=20)
    parser.add_argument("--keep-topics", action="store_true", help="keep this run's topics on the broker (deleted by default)")
    parser.add_argument(
        "--output", type=Path, default=ROOT / "bench" / "results.md", help="markdown copy of the table (its figures as JSON beside it)"
    )
    args = parser.parse_args()
    quick = args.quick
    runs = args.runs or (1 if quick else 3)
    raw_messages = args.raw_messages or (30_000 if quick else 100_000)
    faust_messages = args.faust_messages or (5_000 if quick else 20_000)
    # 10,000: with 2,000 a backlog drained in 0.3 s (three stages) and 0.4 s (inline, five times as many), and its CPU
    # per order was as much the run's start and end as the work
    orders = args.orders or (300 if quick else 10_000)
    light_seconds = args.light_seconds or (5.0 if quick else 10.0)
    trigger_parents = args.trigger_parents or (300 if quick else 1_000)
    eof_clients = args.eof_clients or (8 if quick else 20)
    # 200: the filter alone then runs about a second; with 40 it ran a fifth of one, less than the end-of-stream
    # handshake's own hops after the last batch, and the overhead ratio measured those hops' latency, not the bookkeeping.
    eof_batches = args.eof_batches or (15 if quick else 200)
    barrier_waiting = args.barrier_waiting or (500 if quick else 20_000)
    barrier_released = args.barrier_released or (60 if quick else 150)
    window_records = args.window_records or (20_000 if quick else 100_000)
    named = [name.strip() for name in args.only.split(",") if name.strip()]
    sections = list(dict.fromkeys(section for name in named for section in SECTION_GROUPS.get(name, (name,))))
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}, expected some of {SECTIONS}")
    bootstrap = default_bootstrap()
    run_id = uuid.uuid4().hex[:6]
    ctx = Context(bootstrap, run_id, runs, Path(tempfile.mkdtemp(prefix=f"weir-compare-{run_id}-")), broker_pid())
    ctx.warm_up = args.warm_up if args.warm_up is not None else (300 if quick else 2_000)
    ctx.weir_stages = dict(WEIR_ROLE_STAGES if args.weir_layout == "roles" else WEIR_STAGES)
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
        "weir-inline": lambda: run_weir(ctx, orders, args.rate, light_seconds, args.profile, args.profile_seconds, inline=True),
        "weir-v1": lambda: run_weir(ctx, orders, args.rate, light_seconds, None, 0, transactions="per_partition"),
        "quix-inline": lambda: run_quix(ctx, "inline", orders, args.rate, light_seconds),
        "aiokafka-inline": lambda: run_aiokafka_inline(ctx, orders, args.rate, light_seconds),
        "quix-chunks": lambda: run_quix(ctx, "chunks", orders, args.rate, light_seconds),
        "quix-per-item": lambda: run_quix(ctx, "per-item", orders, args.rate, light_seconds),
        "kstreams-inline": lambda: run_kstreams(ctx, "inline", orders, args.rate, light_seconds),
        "kstreams-chunks": lambda: run_kstreams(ctx, "chunks", orders, args.rate, light_seconds),
        "triggers": lambda: run_triggers(ctx, trigger_parents, args.trigger_children),
        "eof": lambda: run_eof(ctx, eof_clients, eof_batches),
        "barrier": lambda: run_barrier(ctx, barrier_waiting, barrier_released, args.barrier_rate),
        "windows": lambda: run_windows(ctx, window_records, args.window_keys),
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
    ]
    if {"faust", "weir", "weir-inline", "weir-v1", "aiokafka-inline", *QUIX_SECTIONS, *KSTREAMS_SECTIONS} & set(sections):
        notes += [
            "Latency: from the order's send to its result's arrival at a read_committed consumer. weir commits as soon as a worker"
            " is idle for 3 ms (WEIR_COMMIT_IDLE_MS; once commits took a third of the last second, spaced by twice their average"
            " duration) and at least every 0.1 s while busy; Quix Streams commits every 0.1 s. Half the backlog rate: half the"
            f" orders/s of the same run's backlog, offered evenly. A fixed-rate run starts {SETTLE_S:g} s after the run before it"
            " ended (its last commits and timers): the figure is the rate's, not the way down from a backlog.",
            "weir: exactly_once, "
            + (
                "three processes that each run the splitter, items and aggregator agents on their share of the partitions (as"
                " every Quix Streams and Kafka Streams process runs every stage; 4 partitions over 3 processes: one holds two of"
                " each topic's)"
                if ctx.weir_stages == WEIR_STAGES
                else "one splitter+aggregator process and two items processes (--weir-layout roles)"
            )
            + "; 'weir, items inline': the item step run by"
            " the splitter, which sends each order's result itself (WEIR_ITEMS_INLINE=1), two splitter processes. Quix Streams"
            " (bench/quix_split_aggregate.py) in the same forms with as many processes in one consumer group: inline, one stage"
            " (2 processes); split into chunks of 10 -> items topic -> price the chunk -> group_by order id -> merge (3 processes);"
            " and its per-item form, one record per item (3 processes), which weir does not run. Exactly-once, commit interval"
            " 0.1 s and producer linger like weir's (Quix's defaults: 5 s, 5 ms), other settings Quix's defaults (consumer poll"
            " timeout 1 s). Every result of every run is checked: complete, its 10 items priced, adding up to the order's"
            " catalogue total. Kafka Streams 4.1.1 (bench/kstreams/, Java 17) in the inline and chunks forms, as many processes"
            " in one application id, exactly_once_v2, one stream thread per process, the same commit interval and producer"
            " linger, its merge a processor on a persistent (RocksDB, changelogged) store behind a repartition topic keyed by"
            " order id. Warm-up, the same for every pipeline: before its first measured run each pipeline handles"
            f" {ctx.warm_up:,} orders sent at once (a JVM's JIT has compiled the hot paths; every changelog and repartition"
            " partition has been written). Plain Faust: at_least_once (Faust's default), one process.",
        ]
    section_notes = {
        "triggers": "weir triggers: one `triggers` worker, exactly_once, batches of up to 500 events (50 ms), sweep every 5 s after"
        " 10 s of grace (the defaults). Completion events/s: completions / time from the first send to the last wake's arrival at a"
        " read_committed consumer. State writes per event: changelog records of committed transactions over that interval (transaction"
        " markers and aborted writes not counted; sweep writes after the last wake not counted) / events (registrations + completions);"
        " 'all 4 trigger tables' adds the fired markers, sweep queue and fired-marker deadline index to the states"
        " table. A parent is written once per batch: the figure falls as its children arrive closer together (fewer parents in flight).",
        "eof": "weir EOF: exactly_once; every client sends its batches and its end at once. Filter alone: one filter process on its own"
        " topics, timed from the first send to the last filter report ('filtered', counter topic) at a read_committed consumer. Full:"
        " one filter, one controller, one group-by/aggregate and one joiner process, timed to the last client's report. Report latency:"
        " report's arrival"
        " at a read_committed consumer - broker's ack of the client's last batch and end (all clients send at once: mostly the wait"
        " behind the others' batches). EOF overhead ratio: full / filter-alone time"
        " of the same run number, i.e. how much counting, the end-of-stream handshake and aggregation stretch the time to push the same"
        " batches through the filter (1.00: free). Tail: from the filter's report of the last batch to the last client's report"
        " (both as a read_committed consumer saw them): the handshake's part of the full run's time.",
        "barrier": "weir barrier: exactly_once, one flows worker (bench/barrier_flows.py) on new topics each run. Arrivals: from the"
        " first send to dispatch-in to the create time of the last barrier changelog record that made an exchange wait (read"
        " committed, once all were sent); CPU per exchange: the worker's CPU from the first send until the read-back is done, over the"
        " exchanges (two hops each: the dispatch flow's agent, then the barrier's). Bytes per waiting"
        " exchange: the barrier's RocksDB files (WAL included) and its changelog's .log segments on the broker (not the sparse 10 MiB"
        " preallocated index files) / exchanges waiting. Release: kitchen completes, 5 s later payments at the given rate; latency from"
        " each payment's send to the create time of the record the step after the barrier sent (its own commit not included); CPU"
        " over the whole release step (arrivals, kitchen, 5 s pause, payments).",
    }
    notes += [section_notes[name] for name in sections if name in section_notes]
    notes += ctx.notes
    notes.append(f"Total time {elapsed:.0f} s.")
    lines = table(ctx, runs)
    alike = like_with_like(ctx)
    print()
    for line in alike + lines + notes:
        print(line)
    args.output.write_text("\n".join([*(f"    {line}" for line in intro), "", *alike, *lines, *notes, *_changes()]) + "\n")
    figures_path = args.output.with_suffix(".json")
    pipelines = [
        {"work": row.work, "system": row.system, "processes": list(row.workers), "settings": row.settings}
        for row in (pipeline.pipeline for pipeline in ctx.pipelines)
    ]
    figures = {
        "format": FIGURES_FORMAT,
        "intro": intro,
        "runs": runs,
        "figures": [figure.as_json() for figure in ctx.figures],
        "pipelines": pipelines,
    }
    figures_path.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"\nwritten to {args.output} and {figures_path}")


def _changes() -> list[str]:
    """bench/changes.md, what each change to weir's hot path bought (A/B runs of ``bench.ab``), after the figures."""
    path = ROOT / "bench" / "changes.md"
    return ["", *path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    main()
