"""`make demo-eof`: seed 000's deployment, two end-of-stream tasks at once on shared stages, both reports per client.

The same workers run both tasks' stages (``WEIR_EOF_JOB=scoops=...,big=...``): two filter workers, and one worker
for the controller, the group-by/aggregate and the joiner. Each task has its own topics and its own counter per client
(its controller table, ``<task>-eof_counters``: the seed's ``client@stage`` key, the one stage that changes the number
of batches being the filter):

* ``scoops`` (:data:`examples.eof_orders.ORDERS`): filter -> group-by/aggregate -> joiner -> gateway, scoops and
  revenue per flavour;
* ``big`` (:data:`BIG_ORDERS`): the seed's task 1, the filter answers the gateway itself: the client's orders of five
  scoops or more, as they were kept.

Every client is sent to both tasks at once; the demo prints both reports and checks each against the report computed
sequentially (exit 0 when all match).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from examples.eof_orders import ORDERS, parse_order
from shop.catalogue import CATALOGUE_CENTS
from shop.settings import demo_web_port
from weir import CommandParser
from weir.app.eof_gateway import Gateway
from weir.app.kafka_io import check_broker, delete_topics
from weir.app.processes import run_main, start_workers, supervised
from weir.app.settings import load_settings
from weir.tables.eof import Dropped, EofJob, reference_report

__all__ = ["BIG_ORDERS", "BIG_SCOOPS", "JOBS_SETTING", "big_order", "make_clients", "expected_big"]

ROOT = Path(__file__).resolve().parent.parent
#: An order of this many scoops or more is a big one.
BIG_SCOOPS = 5


def big_order(line: Any) -> dict[str, Any]:
    """The big-orders task's filter: an order the scoops task would keep, of :data:`BIG_SCOOPS` scoops or more, as
    ``{"order_id", "time", "scoops"}``; any other line is dropped."""
    order = parse_order(line)
    scoops = sum(number for _, number in order["items"])
    if scoops < BIG_SCOOPS:
        raise Dropped(f"order {order['order_id']!r}: {scoops} scoops")
    return {"order_id": order["order_id"], "time": order["time"], "scoops": scoops}


#: Seed 000's task 1: the filter answers the gateway.
BIG_ORDERS = EofJob.answered_by_filter("big orders", select=big_order)
#: The two tasks, as the eof_* agents take them.
JOBS_SETTING = "scoops=examples.eof_orders:ORDERS,big=examples.eof_tasks:BIG_ORDERS"
#: The demo's processes: two filter workers share both tasks' batches; one worker runs the rest of both.
STAGES = ("eof_filter", "eof_filter", "eof_controller,eof_aggregator,eof_joiner")


def make_clients(clients: int, orders: int, *, seed: int = 7) -> dict[str, list[str]]:
    """Each client's order lines (JSON text), reproducibly: a few outside opening hours, unknown or broken."""
    rng = random.Random(seed)
    flavours = sorted(CATALOGUE_CENTS)
    made: dict[str, list[str]] = {}
    for number in range(1, clients + 1):
        lines = []
        for order in range(orders):
            roll = rng.random()
            if roll < 0.03:
                lines.append("{broken")
                continue
            hour = rng.randint(8, 23) if roll < 0.1 else rng.randint(10, 21)
            items = [{"flavour": rng.choice(flavours), "scoops": rng.randint(1, 3)} for _ in range(rng.randint(1, 3))]
            if roll > 0.98:
                items[0]["flavour"] = "durian"
            lines.append(json.dumps({"order_id": f"c{number}-{order:04}", "time": f"{hour:02}:{rng.randint(0, 59):02}", "items": items}))
        made[f"client-{number}"] = lines
    return made


def expected_big(lines: list[str]) -> list[dict[str, Any]]:
    kept = []
    for line in lines:
        try:
            kept.append(big_order(line))
        except ValueError:
            continue
    return kept


def _print(client: str, scoops: dict[str, Any], big: dict[str, Any]) -> None:
    print(f"\n{client}")
    flavours = ", ".join(f"{flavour} {entry['scoops']}" for flavour, entry in scoops.get("flavours", {}).items())
    print(f"  scoops  {scoops.get('status')}: {scoops.get('orders')} orders, {scoops.get('revenue_cents', 0) / 100:.2f}; {flavours}")
    records = big.get("records", [])
    shown = ", ".join(f"{record['order_id']} ({record['scoops']})" for record in records[:6])
    print(f"  big     {big.get('status')}: {len(records)} orders of {BIG_SCOOPS}+ scoops: {shown}{', ...' if len(records) > 6 else ''}")


async def _run(clients: int, orders: int, timeout_s: float, keep: bool) -> int:
    settings = load_settings()
    await check_broker(settings.bootstrap)  # before any worker starts: one line if it cannot be used (see run_main)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"eof-{run_id}."
    env = {**os.environ, "WEIR_EOF_JOB": JOBS_SETTING, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": f"eof-{run_id}", "PYTHONPATH": str(ROOT)}
    log_dir = Path(tempfile.mkdtemp(prefix=f"weir-eof-{run_id}-"))
    print(f"weir end of stream: {clients} clients of {orders} order lines, two tasks at once, broker {settings.bootstrap}")
    workers = start_workers(STAGES, env, log_dir, demo_web_port())
    ok = False
    try:
        data = make_clients(clients, orders)

        def topic(name: str) -> str:
            return f"{prefix}{name}"

        async with (
            supervised(workers),
            Gateway(settings.bootstrap, topic, partitions=settings.partitions, job="scoops") as scoops,
            Gateway(settings.bootstrap, topic, partitions=settings.partitions, job="big") as big,
        ):
            runs = [scoops.run_client(client, lines, batch_size=20, timeout_s=timeout_s) for client, lines in data.items()]
            runs += [big.run_client(client, lines, batch_size=20, timeout_s=timeout_s) for client, lines in data.items()]
            reports = await asyncio.gather(*runs)
        ok = True
        for number, (client, lines) in enumerate(data.items()):
            scoops_report, big_report = reports[number], reports[len(data) + number]
            _print(client, scoops_report, big_report)
            reference = reference_report(client, lines, ORDERS)
            same = {key: scoops_report.get(key) for key in reference} == reference
            big_same = big_report.get("status") == "complete" and big_report.get("records") == expected_big(lines)
            verdict = ("= reference" if same else "DIFFERS from the reference", "= reference" if big_same else "DIFFERS")
            print(f"  check   scoops {verdict[0]}; big {verdict[1]}")
            ok &= same and big_same
        return 0 if ok else 1
    finally:
        if keep or not ok:
            print(f"\ntopics {prefix}* kept; worker logs in {log_dir}")
        else:
            await delete_topics(settings.bootstrap, f"eof-{run_id}", client_options=settings.kafka_client_options())
            shutil.rmtree(log_dir, ignore_errors=True)


def main() -> None:
    parser = CommandParser(prog="python -m examples.eof_tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3, help="clients, each sent to both tasks")
    parser.add_argument("--orders", type=int, default=300, help="order lines per client")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a client waits for each report")
    parser.add_argument("--keep", action="store_true", help="keep the run's topics and worker logs (kept anyway when a check fails)")
    arguments = parser.parse_args()
    run_main(_run(arguments.clients, arguments.orders, arguments.timeout, arguments.keep))


if __name__ == "__main__":
    main()
