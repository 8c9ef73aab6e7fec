"""Barrier figures on the real broker: `python -m bench.barrier [--waiting N] [--released M]`.

One flows worker process. (1) N exchanges arrive and wait (nothing they await has completed): time
until all are in the barrier table, the worker's threads and asyncio tasks while they wait (waiting
holds none), and bytes on disk per waiting exchange (the barrier's RocksDB files in the worker, and its
changelog on the broker). (2) M more exchanges wait for kitchen, which completes, then payment: release
latency from the payment record (the last completion) to the record the step after the barrier sent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer

from app.kafka_io import ensure_topics, read_topic
from app.processes import ROOT, WorkerProcess
from app.settings import load_settings

BARRIER = "await-kitchen-and-payment"


async def _send(bootstrap: str, topic: str, keys: list[str], *, rate: float | None = None) -> dict[str, float]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    sent: dict[str, float] = {}
    started = time.monotonic()
    try:
        for number, key in enumerate(keys):
            if rate:
                delay = started + number / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            sent[key] = time.time()
            await producer.send(
                topic, key=key.encode(), value=b'{"order_id": "' + key.encode() + b'"}', headers=[("order-id", key.encode())]
            )
        await producer.flush()
    finally:
        await producer.stop()
    return sent


def _du(paths: list[Path]) -> int:
    return sum(file.stat().st_size for path in paths for file in path.rglob("*") if file.is_file())


async def _count_waiting(bootstrap: str, topic: str, wanted: int, timeout_s: float) -> int:
    latest: dict[bytes, bool] = {}

    def enough(rows: list[object]) -> bool:
        for row in rows[len(latest_rows) :]:
            latest[row.key] = bool(row.value) and b'"waiting":[{' in row.value  # type: ignore[attr-defined]
        latest_rows[:] = rows
        return sum(latest.values()) >= wanted

    latest_rows: list[object] = []
    await read_topic(bootstrap, topic, until=enough, timeout_s=timeout_s)
    return sum(latest.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--waiting", type=int, default=20_000)
    parser.add_argument("--released", type=int, default=300)
    parser.add_argument("--rate", type=float, default=30.0, help="payments/s in the release run")
    args = parser.parse_args()
    settings = load_settings()
    run = uuid.uuid4().hex[:6]
    prefix = f"bb-{run}."
    log_dir = Path(tempfile.mkdtemp(prefix=f"weir-bench-barrier-{run}-"))
    env = {**os.environ, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": f"bb-{run}", "WEIR_FLOWS": "bench.barrier_flows"}
    topics = ["kitchen", "payment", "dispatch-in", "dispatched", "dead-letters", f"barrier.{BARRIER}"]
    topics += [f"flow.{name}.{kind}" for name in ("kitchen", "payment", "dispatch") for kind in ("resume", "outcomes")]
    asyncio.run(ensure_topics(settings.bootstrap, [prefix + name for name in topics], settings.partitions))
    data_dir = log_dir / "data"
    worker = WorkerProcess("flows", {**env, "WEIR_DATA_DIR": str(data_dir)}, log_dir / "worker.log", 6300).start()
    try:
        worker.wait_ready()
        keys = [f"w-{number}" for number in range(args.waiting)]
        started = time.monotonic()
        asyncio.run(_send(settings.bootstrap, prefix + "dispatch-in", keys))
        waiting = asyncio.run(_count_waiting(settings.bootstrap, f"{prefix}barrier-{BARRIER}-changelog", len(keys), timeout_s=1800))
        fill_seconds = time.monotonic() - started
        assert worker.process is not None
        pid = worker.process.pid
        threads = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Threads:")))
        rss_mb = (
            int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))) / 1024
        )
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
        tasks = worker.log_path.read_text(errors="replace").split("asyncio tasks:")[-1].count("\n--- ")
        rocksdb = _du([path for path in data_dir.rglob(f"barrier-{BARRIER}-[0-9]*.db") if path.is_dir()])
        broker_dir = Path(os.environ.get("WEIR_STATE_DIR", str(ROOT / ".weir"))) / "kafka-data"
        changelog = _du(list(broker_dir.glob(f"{prefix}barrier-{BARRIER}-changelog-*")))
        released = [f"r-{number}" for number in range(args.released)]
        asyncio.run(_send(settings.bootstrap, prefix + "dispatch-in", released))
        asyncio.run(_send(settings.bootstrap, prefix + "kitchen", released))
        time.sleep(5)
        wanted = set(released)

        async def release() -> tuple[dict[str, float], list[object]]:
            reader = asyncio.create_task(
                read_topic(
                    settings.bootstrap,
                    prefix + "dispatched",
                    until=lambda rows: wanted <= {row.key.decode() for row in rows},
                    timeout_s=300,
                )
            )
            sent = await _send(settings.bootstrap, prefix + "payment", released, rate=args.rate)
            return sent, await reader

        sent, rows = asyncio.run(release())
        latencies = sorted(row.timestamp / 1000 - sent[row.key.decode()] for row in rows if row.key.decode() in sent)  # type: ignore[attr-defined]
    finally:
        worker.stop()
    print(f"barrier: {waiting} exchanges waiting on one worker, filled in {fill_seconds:.1f}s ({waiting / fill_seconds:.0f}/s)")
    print(f"  while waiting: {threads} threads, {tasks} asyncio tasks, RSS {rss_mb:.0f} MiB")
    print(f"  bytes per waiting exchange: RocksDB {rocksdb / max(1, waiting):.0f}, broker changelog {changelog / max(1, waiting):.0f}")
    if latencies:
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(f"  release latency (last completion -> next step's output), {len(latencies)} at {args.rate:g}/s:")
        print(f"    p50 {1000 * statistics.median(latencies):.0f} ms, p99 {1000 * p99:.0f} ms")
    print(f"worker log: {worker.log_path}")


if __name__ == "__main__":
    main()
