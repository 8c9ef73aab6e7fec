"""Barrier figures on the real broker: `python -m bench.barrier [--waiting N] [--released M]`.

One flows worker process. (1) N exchanges arrive and wait (nothing they await has completed): time
until all are in the barrier table, the worker's threads and asyncio tasks while they wait (waiting
holds none), and bytes on disk per waiting exchange (the barrier's RocksDB files in the worker, and its
changelog's log segments on the broker). (2) M more exchanges wait for kitchen, which completes, then
payment: release latency from the payment record (the last completion) to the record the step after the
barrier sent.

The steps are functions (start_worker, fill, disk_bytes, release) that bench.compare's barrier section runs too.
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

from bench._util import CpuMeter
from weir.app.kafka_io import delete_topics, ensure_topics, read_topic
from weir.app.processes import ROOT, WorkerProcess
from weir.app.settings import load_settings

__all__ = ["BARRIER", "start_worker", "fill", "disk_bytes", "release"]

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


async def _count_waiting(bootstrap: str, topic: str, wanted: int, timeout_s: float) -> tuple[int, float]:
    """(exchanges waiting in the barrier's changelog, the create time of the last changelog record that made one wait)."""
    latest: dict[bytes, bool] = {}
    last_write = [0.0]
    seen = [0]

    def enough(rows: list[object]) -> bool:
        for row in rows[seen[0] :]:
            now_waiting = bool(row.value) and b'"waiting":[{' in row.value  # type: ignore[attr-defined]
            if now_waiting and not latest.get(row.key):  # type: ignore[attr-defined]
                last_write[0] = max(last_write[0], row.timestamp / 1000)  # type: ignore[attr-defined]
            latest[row.key] = now_waiting  # type: ignore[attr-defined]
        seen[0] = len(rows)
        return sum(latest.values()) >= wanted

    await read_topic(bootstrap, topic, until=enough, timeout_s=timeout_s)
    return sum(latest.values()), last_write[0]


def start_worker(bootstrap: str, partitions: int, prefix: str, app_id: str, work_dir: Path, web_port: int) -> WorkerProcess:
    """Creates the flows' topics and starts one flows worker (bench.barrier_flows), ready; its data in ``work_dir / 'data'``."""
    env = {**os.environ, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": app_id, "WEIR_FLOWS": "bench.barrier_flows"}
    topics = ["kitchen", "payment", "dispatch-in", "dispatched", "dead-letters", f"barrier.{BARRIER}"]
    topics += [f"flow.{name}.{kind}" for name in ("kitchen", "payment", "dispatch") for kind in ("resume", "outcomes")]
    asyncio.run(ensure_topics(bootstrap, [prefix + name for name in topics], partitions))
    worker = WorkerProcess("flows", {**env, "WEIR_DATA_DIR": str(work_dir / "data")}, work_dir / "worker.log", web_port).start()
    try:
        worker.wait_ready()
    except BaseException:
        worker.stop()
        raise
    return worker


def fill(bootstrap: str, prefix: str, keys: list[str], timeout_s: float = 1800) -> tuple[int, float]:
    """Sends ``keys`` to dispatch-in; (exchanges waiting in the barrier table, seconds until all of them wait).

    The seconds run from the first send to the create time of the last changelog record that made an exchange
    wait (the worker's clock, the same machine's), read back once all are sent: the time the reader takes to
    catch up is not the barrier's. The records are read committed, so each of them was committed too.
    """

    started = time.time()
    asyncio.run(_send(bootstrap, prefix + "dispatch-in", keys))
    waiting, last_write = asyncio.run(_count_waiting(bootstrap, f"{prefix}barrier-{BARRIER}-changelog", len(keys), timeout_s=timeout_s))
    return waiting, last_write - started


def disk_bytes(prefix: str, data_dir: Path) -> tuple[int, int]:
    """(the barrier's RocksDB files in the worker, its changelog's log segments on the local broker), in bytes.

    Only the segments' .log files count on the broker: the active segment's .index and .timeindex files are
    sparse files preallocated to 10 MiB each (their size says nothing of the records).
    """
    rocksdb = _du([path for path in data_dir.rglob(f"barrier-{BARRIER}-[0-9]*.db") if path.is_dir()])
    broker_dir = Path(os.environ.get("WEIR_STATE_DIR", str(ROOT / ".weir"))) / "kafka-data"
    segments = [file for path in broker_dir.glob(f"{prefix}barrier-{BARRIER}-changelog-*") for file in path.glob("*.log")]
    return rocksdb, sum(file.stat().st_size for file in segments)


def release(bootstrap: str, prefix: str, keys: list[str], rate: float, settle_s: float = 5.0) -> list[float]:
    """``keys`` arrive and wait, kitchen completes them, ``settle_s`` later payment completes them at ``rate``/s.

    Returns the release latencies (s), sorted: from each payment's send to the create time of the record the
    step after the barrier sent for it.
    """
    asyncio.run(_send(bootstrap, prefix + "dispatch-in", keys))
    asyncio.run(_send(bootstrap, prefix + "kitchen", keys))
    time.sleep(settle_s)
    wanted = set(keys)

    async def payments() -> tuple[dict[str, float], list[object]]:
        reader = asyncio.create_task(
            read_topic(bootstrap, prefix + "dispatched", until=lambda rows: wanted <= {row.key.decode() for row in rows}, timeout_s=300)
        )
        sent = await _send(bootstrap, prefix + "payment", keys, rate=rate)
        return sent, await reader

    sent, rows = asyncio.run(payments())
    return sorted(row.timestamp / 1000 - sent[row.key.decode()] for row in rows if row.key.decode() in sent)  # type: ignore[attr-defined]


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
    worker = start_worker(settings.bootstrap, settings.partitions, prefix, f"bb-{run}", log_dir, 6300)
    try:
        keys = [f"w-{number}" for number in range(args.waiting)]
        assert worker.process is not None
        pid = worker.process.pid
        meter = CpuMeter({"worker": pid}).start()
        waiting, fill_seconds = fill(settings.bootstrap, prefix, keys)
        meter.stop()
        fill_cpu = meter.seconds["worker"]
        threads = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Threads:")))
        rss_mb = (
            int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))) / 1024
        )
        os.kill(pid, signal.SIGUSR1)
        time.sleep(2)
        tasks = worker.log_path.read_text(errors="replace").split("asyncio tasks:")[-1].count("\n--- ")
        rocksdb, changelog = disk_bytes(prefix, log_dir / "data")
        latencies = release(settings.bootstrap, prefix, [f"r-{number}" for number in range(args.released)], args.rate)
    finally:
        worker.stop()
        asyncio.run(delete_topics(settings.bootstrap, f"bb-{run}"))  # its topics (and its app id's) would pile up on a long-running broker
    print(f"barrier: {waiting} exchanges waiting on one worker, filled in {fill_seconds:.1f}s ({waiting / fill_seconds:.0f}/s)")
    print(f"  the worker's CPU while they arrived: {1000 * fill_cpu / max(1, waiting):.3f} ms per exchange (the read back included)")
    print(f"  while waiting: {threads} threads, {tasks} asyncio tasks, RSS {rss_mb:.0f} MiB")
    print(f"  bytes per waiting exchange: RocksDB {rocksdb / max(1, waiting):.0f}, broker changelog {changelog / max(1, waiting):.0f}")
    if latencies:
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(f"  release latency (last completion -> next step's output), {len(latencies)} at {args.rate:g}/s:")
        print(f"    p50 {1000 * statistics.median(latencies):.0f} ms, p99 {1000 * p99:.0f} ms")
    print(f"worker log: {worker.log_path}")


if __name__ == "__main__":
    main()
