"""Windowed aggregation on event time, weir beside Quix Streams on the same records: the ``windows`` section of
``python -m bench.compare`` (``--only windows``).

The work: ``records`` readings (150-200 byte JSON: sensor id, an integer value, padding), keyed by ``sensors``
sensor ids over 4 partitions, each record's Kafka timestamp its event time: 10 ms apart, up to 300 ms out of order.
Per sensor and tumbling window of 10 s with 1 s of grace, the sum of the values and the number of records: one
final result per window, when the partition's stream time passes its end and the grace. After the readings, one
record per sensor a minute later closes every window (their own windows are not counted).

- weir: one ``windows`` worker (``WEIR_WINDOWS=bench.windows``: :data:`WINDOWS`), exactly_once, its defaults.
- Quix Streams: one process, ``tumbling_window(10_000, grace_ms=1_000).agg(value=Sum("value"), count=Count())
  .final(closing_strategy="partition")`` (stream time per partition, as weir's), exactly-once, weir's commit
  interval and producer linger; ``python -m bench.windows quix``.

Before each run both are warm: one window per partition opened and closed, its result read. Then from the first
send of the readings until every expected window's result is read by a read_committed consumer: records/s, and the
CPU the worker and the broker used per record. Every result is checked against the sums the harness computed
(value, count); a window missing, wrong or read twice fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from weir import Window, WindowSpec, total
from weir.app.kafka_io import ensure_topics, key_partition

if TYPE_CHECKING:
    from quixstreams import Application as QuixApplication

__all__ = ["WINDOWS", "WINDOW_MS", "GRACE_MS", "Work", "work", "measure", "quix_app"]

WINDOW_MS = 10_000
GRACE_MS = 1_000
#: event time between two readings, and how far a reading may come before the one sent ahead of it
STEP_MS = 10
DISORDER_MS = 300
PARTITIONS = 4
#: how far in the past the readings' first event time is: recent enough that the broker's retention (7 days, by the
#: records' timestamps) deletes none of them during the run, which a fixed time in the past did
BEHIND_MS = 3_600_000

#: What the weir worker runs (``WEIR_WINDOWS=bench.windows``; the topics get the run's ``WEIR_TOPIC_PREFIX``).
WINDOWS = [
    Window("readings", source="readings", to="sums", spec=WindowSpec.tumbling(WINDOW_MS, grace_ms=GRACE_MS), initial=0, fold=total("value"))
]


@dataclass
class Work:
    """The records of one run, in send order, and the result each window must have."""

    records: list[tuple[str, bytes, int]]
    #: (sensor, window start) -> (sum, count)
    expected: dict[tuple[str, int], tuple[int, int]]
    #: per partition, a sensor that goes there (the warm-up's)
    warm_keys: list[str]
    #: the event time of the warm-up's window (an hour before the readings)
    warm_ms: int


def work(records: int, sensors: int, seed: int = 7, *, base_ms: int | None = None) -> Work:
    """``records`` readings over ``sensors`` sensors from ``base_ms`` (default: an hour ago, on a window's start), then one
    closing record per sensor a minute later."""
    if base_ms is None:
        now = int(time.time() * 1000)
        base_ms = now - now % WINDOW_MS - BEHIND_MS
    rng = random.Random(seed)
    names = [f"s-{number:04d}" for number in range(sensors)]
    padding = "x" * 100
    sent: list[tuple[str, bytes, int]] = []
    expected: dict[tuple[str, int], tuple[int, int]] = {}
    for number in range(records):
        sensor = names[rng.randrange(sensors)]
        stamp = base_ms + number * STEP_MS - rng.randrange(DISORDER_MS)
        value = rng.randrange(1_000)
        sent.append((sensor, orjson.dumps({"sensor": sensor, "value": value, "unit": "W", "note": padding}), stamp))
        start = stamp - stamp % WINDOW_MS
        before = expected.get((sensor, start), (0, 0))
        expected[(sensor, start)] = (before[0] + value, before[1] + 1)
    closing = base_ms + records * STEP_MS + 60_000
    sent += [(sensor, orjson.dumps({"sensor": sensor, "value": 0, "unit": "W", "note": "close"}), closing) for sensor in names]
    by_partition: dict[int, str] = {}
    for sensor in names:
        by_partition.setdefault(key_partition(sensor.encode(), PARTITIONS), sensor)
    if len(by_partition) < PARTITIONS:
        raise ValueError(f"{sensors} sensors reach {len(by_partition)} of {PARTITIONS} partitions")
    return Work(sent, expected, [by_partition[partition] for partition in range(PARTITIONS)], base_ms - 3_600_000)


@dataclass
class Results:
    """What a read_committed consumer of the results topic read: each window's result, and the problems."""

    seen: dict[tuple[str, int], tuple[Any, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


async def _read(consumer: AIOKafkaConsumer, results: Results) -> None:
    while True:
        batch = await consumer.getmany(timeout_ms=100, max_records=5_000)
        for messages in batch.values():
            for message in messages:
                value = orjson.loads(message.value) if message.value else {}
                sensor = message.key.decode() if message.key else ""
                window = (sensor, int(value.get("start_ms", -1)))
                if window in results.seen:
                    results.problems.append(f"{window}: a second result {value}")
                results.seen[window] = (value.get("value"), value.get("count"))
        if batch:
            results.changed.set()


async def _wait(results: Results, wanted: set[tuple[str, int]], timeout_s: float, alive: Any) -> None:
    deadline = time.monotonic() + timeout_s
    while not wanted <= results.seen.keys():
        alive()
        if time.monotonic() > deadline:
            missing = sorted(wanted - results.seen.keys())
            raise RuntimeError(f"{len(missing)} window results missing after {timeout_s:g} s, e.g. {missing[:3]}")
        results.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(results.changed.wait(), 1.0)


async def measure(bootstrap: str, source: str, results_topic: str, run: Work, meter: Any, alive: Any) -> tuple[float, dict[str, float]]:
    """Warm the worker up, then send the run's records; return (seconds from the first send to the last expected
    result read, the CPU each metered process used meanwhile, % of one core). Raises on any wrong result."""
    consumer = AIOKafkaConsumer(
        results_topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        fetch_max_wait_ms=50,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all", max_batch_size=256 * 1024)
    await consumer.start()
    await producer.start()
    results = Results()
    reader = asyncio.create_task(_read(consumer, results))
    try:
        warm = {"sensor": "warm", "value": 0, "unit": "W", "note": "warm"}
        for sensor in run.warm_keys:  # a window per partition, opened, then closed by a record 20 s later
            for stamp in (run.warm_ms, run.warm_ms + 2 * WINDOW_MS):
                await producer.send(source, key=sensor.encode(), value=orjson.dumps(warm), timestamp_ms=stamp)
        await producer.flush()
        await _wait(results, {(sensor, run.warm_ms) for sensor in run.warm_keys}, 120.0, alive)
        meter.start()
        began = time.monotonic()
        for sensor, value, stamp in run.records:
            await producer.send(source, key=sensor.encode(), value=value, timestamp_ms=stamp)
        await producer.flush()
        await _wait(results, set(run.expected), 600.0, alive)
        took = time.monotonic() - began
        cpu = meter.stop()
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await producer.stop()
        await consumer.stop()
    wrong = [
        f"{window}: {results.seen[window]}, expected {expected}"
        for window, expected in run.expected.items()
        if tuple(results.seen[window]) != expected
    ]
    problems = results.problems + wrong
    if problems:
        raise RuntimeError(f"{len(problems)} wrong window results, e.g. {problems[:3]}")
    return took, cpu


async def create_topics(bootstrap: str, names: list[str]) -> None:
    await ensure_topics(bootstrap, names, PARTITIONS)


def quix_app() -> QuixApplication:
    """Quix Streams' side: the same windows, from BENCH_SOURCE to BENCH_RESULTS (see the module's docstring)."""
    from quixstreams.dataframe.windows.aggregations import Count, Sum
    from quixstreams.models import TopicConfig

    from bench.quix_split_aggregate import quix_application

    app = quix_application("bench-quix-windows", "/tmp/bench-quix-windows-state")
    config = TopicConfig(num_partitions=PARTITIONS, replication_factor=1)
    source = app.topic(os.environ["BENCH_SOURCE"], key_deserializer="str", config=config)
    results = app.topic(os.environ["BENCH_RESULTS"], key_serializer="str", config=config)
    windows = (
        app.dataframe(source)
        .tumbling_window(WINDOW_MS, grace_ms=GRACE_MS)
        .agg(value=Sum("value"), count=Count())
        .final(closing_strategy="partition")
    )
    windows.apply(
        lambda window: {"start_ms": window["start"], "end_ms": window["end"], "value": window["value"], "count": window["count"]}
    ).to_topic(results)
    return app


def quix_command() -> list[str]:
    return [sys.executable, "-m", "bench.windows", "quix"]


def state_dir(work_dir: Path, name: str) -> str:
    return str(work_dir / f"{name}-state")


if __name__ == "__main__":
    if sys.argv[1:] != ["quix"]:
        raise SystemExit("python -m bench.windows quix: Quix Streams' side (bench.compare --only windows runs both)")
    quix_app().run()
