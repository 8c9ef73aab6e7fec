"""`make demo-split`: the split/aggregate pipeline on a file of orders, with workers as separate processes."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from examples.pricing import STEP as DEMO_STEP
from shop.settings import demo_web_port
from weir import CommandParser
from weir.app.kafka_io import check_broker, ensure_topics, produce, read_topic
from weir.app.processes import Supervisor, announce_restart, run_main, start_workers
from weir.app.settings import load_settings
from weir.app.split import InvalidMessage, split_order

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ORDERS = ROOT / "demo" / "orders.jsonl"
#: The demo's processes: one runs the splitter and the aggregator, two share the item work.
STAGES = ("splitter,aggregator", "items", "items")


def _read_lines(path: Path) -> tuple[list[tuple[bytes, bytes]], set[str]]:
    records, order_ids = [], set()
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            order_id, _ = split_order(orjson.loads(line))
            order_ids.add(order_id)
        except (orjson.JSONDecodeError, InvalidMessage):
            order_id = f"line-{number}"  # sent as is: the splitter dead-letters it with a reason
        records.append((order_id.encode(), line))
    return records, order_ids


def _print_result(result: dict[str, Any]) -> None:
    statuses = Counter(item["status"] for item in result["items"])
    total_cents = sum(item["result"]["price_cents"] for item in result["items"] if item["status"] == "ok")
    detail = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    print(f"  {result['correlation_id']:<12} {result['status']:<8} {detail:<22} total {total_cents / 100:8.2f}")
    for item in result["items"]:
        if item["status"] == "failed":
            print(f"      item {item['index']}: {item['error']}")


async def _run(orders_path: Path, timeout_s: float) -> int:
    settings = load_settings()
    run_id = uuid.uuid4().hex[:6]
    prefix = f"demo-{run_id}."
    env = {
        "WEIR_ITEM_PROCESSOR": DEMO_STEP,
        **os.environ,
        "WEIR_TOPIC_PREFIX": prefix,
        "WEIR_APP_ID": f"demo-{run_id}",
        "PYTHONPATH": str(ROOT),
    }
    records, order_ids = _read_lines(orders_path)
    await check_broker(settings.bootstrap)  # before any worker starts: one line if it cannot be used (see run_main)
    names = [f"{prefix}{name}" for name in ("orders", "items", "item-results", "aggregates", "dead-letters")]
    await ensure_topics(settings.bootstrap, names, settings.partitions)
    log_dir = Path(tempfile.mkdtemp(prefix=f"weir-demo-{run_id}-"))
    print(f"weir demo: {len(records)} lines from {orders_path} ({len(order_ids)} orders), broker {settings.bootstrap}")
    processes = start_workers(STAGES, env, log_dir, demo_web_port())
    # a worker that stops itself (its producer fenced after a broker outage, say) is restarted in its slot
    supervisor = Supervisor(processes, on_restart=announce_restart)
    supervisor.start()
    try:
        started = time.monotonic()
        await produce(settings.bootstrap, f"{prefix}orders", records)
        print(f"sent {len(records)} lines to {prefix}orders; waiting for results...")
        expected = set(order_ids)

        def progress(rows: list[Any]) -> bool:
            # an invalid line is answered too (an 'invalid' result under its key): wait for every order's own result
            return expected <= {row["correlation_id"] for row in rows}

        results = await read_topic(settings.bootstrap, f"{prefix}aggregates", until=progress, timeout_s=timeout_s, decode=orjson.loads)
        elapsed = time.monotonic() - started
        by_id = {result["correlation_id"]: result for result in results}
        for order_id in sorted(by_id, key=lambda name: (len(name), name)):
            _print_result(by_id[order_id])
        letters = await read_topic(
            settings.bootstrap, f"{prefix}dead-letters", until=lambda rows: False, timeout_s=2.0, decode=orjson.loads
        )
        completed = {order_id: result for order_id, result in by_id.items() if order_id in expected}
        statuses = Counter(result["status"] for result in completed.values())
        failed_items = sum(len(result["failed"]) for result in completed.values())
        print("\nsummary")
        print(f"  orders completed   {len(completed)} of {len(order_ids)} in {elapsed:.1f}s ({dict(statuses)})")
        print(f"  other lines        {len(by_id) - len(completed)} answered 'invalid' under their key")
        print(f"  items failed       {failed_items} (each also dead-lettered)")
        print(f"  dead letters       {len(letters)}: {dict(Counter(letter['reason'] for letter in letters))}")
        print(f"  worker logs        {log_dir}")
        return 0 if len(completed) == len(expected) else 1
    finally:
        supervisor.stop()
        for worker in processes:
            worker.stop()


def main() -> None:
    parser = CommandParser(prog="python -m examples.split_aggregate", description=__doc__)
    parser.add_argument("--orders", type=Path, default=DEFAULT_ORDERS, help="JSON-lines file of orders")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for every result")
    args = parser.parse_args()
    run_main(_run(args.orders, args.timeout))


if __name__ == "__main__":
    main()
