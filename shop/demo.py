"""`make demo`: the ice-cream shop, its stages as separate worker processes, one screen per order file.

Each run opens a fresh shop (its own topic prefix and consumer groups): full containers, no payments.
Prints progress while the screens serve their customers, then each screen's end-of-day report, the stock
left and the money check; stops every worker at the end or on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from shop.day import JOB_SETTING
from shop.flows import FLOWS_SETTING
from shop.flows import describe as dispatch_flows
from shop.screens import ScreenProgress, Screens, Unreadable, latencies_of, latency_ms, payments_by_state, read_screen_lines, stock_left
from shop.settings import demo_web_port
from weir import CommandParser
from weir.app.kafka_io import check_broker, delete_topics, read_to_end
from weir.app.processes import WorkerProcess, run_main, start_workers, supervised
from weir.app.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ORDERS = ROOT / "demo" / "shop"
#: The shop's processes: two kitchen robots and two payment workers share their partitions; the dispatch is weir's
#: flows agents running the shop's flows; the end of day runs on the end-of-stream agents (the screens' outcomes
#: are its filter stage's output, shop/day.py).
STAGES = (
    "shop_orders,shop_claims",
    "shop_payments",
    "shop_payments",
    "shop_kitchen",
    "shop_kitchen",
    "flows",
    "eof_controller,eof_aggregator,eof_joiner",
)
#: The entry module of every shop worker (``faust -A shop.main worker``): it registers the shop's agent sets.
ENTRY = "shop.main"
#: What every shop worker runs with: the flows agents run the shop's flows, the end-of-stream agents its end of day.
WORKER_ENV = {"WEIR_FLOWS": FLOWS_SETTING, "WEIR_EOF_JOB": JOB_SETTING}
#: The demo's defaults (each can be overridden from the environment).
DEMO_ENV = {"WEIR_SHOP_STOCK_OVERRIDES": "pistachio=120", "WEIR_COMMIT_INTERVAL": "0.1"}


def start_shop_workers(env: dict[str, str], log_dir: Path, first_port: int) -> list[WorkerProcess]:
    """One worker per stage (:func:`app.processes.start_workers`); worker N's web views on ``first_port`` + N
    (``WEIR_DEMO_WEB_PORT``)."""
    workers = start_workers(STAGES, env, log_dir, first_port, entry=ENTRY)
    print("  flows runs the shop's dispatch, the flows of shop/flows.py on weir's flow API:")
    for flow in dispatch_flows():
        print(f"    {flow}")
    return workers


def _euros(cents: int) -> str:
    return f"{cents / 100:,.2f}"


def _report_or_failure(outcome: dict[str, Any] | BaseException) -> dict[str, Any]:
    if isinstance(outcome, BaseException):
        if not isinstance(outcome, Exception):
            raise outcome  # a cancellation or an interrupt stops the demo
        return {"failed": f"{type(outcome).__name__}: {outcome}"}
    return outcome


def print_report(name: str, report: dict[str, Any]) -> None:
    if "failed" in report:
        print(f"  {name:<10} NO REPORT: the screen failed: {report['failed']}")
        return
    if report.get("status") != "complete":
        print(f"  {name:<10} NO REPORT: the day ended {report.get('status')}: {report.get('error', report)}")
        return
    reasons = ", ".join(f"{count} {reason}" for reason, count in report["aborted_by_reason"].items()) or "none"
    print(
        f"  {name:<10} lines {report['lines']:>4}  served {report['served']:>4}  aborted {report['aborted']:>3} ({reasons})"
        f"  invalid {report['invalid']:>2}  duplicate {report.get('duplicate', 0):>2}  revenue {_euros(report['revenue_cents']):>10}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def print_latency(progress: dict[str, ScreenProgress]) -> None:
    """Each screen's per-order latency, from a line's send to its outcome (the screen waits for it before its next
    customer), and all screens' together."""
    print("\nper-order latency, line sent -> outcome read")
    for name, screen in progress.items():
        p50, p99 = screen.latency_ms(0.5), screen.latency_ms(0.99)
        print(f"  {name:<10} p50 {_ms(p50):>9}  p99 {_ms(p99):>9}  ({len(screen.latencies_s)} lines)")
    every = latencies_of(progress)
    print(f"  {'all':<10} p50 {_ms(latency_ms(every, 0.5)):>9}  p99 {_ms(latency_ms(every, 0.99)):>9}  ({len(every)} lines)")


async def _progress(progress: dict[str, ScreenProgress], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with_counts = [f"{p.screen} {p.done}/{p.lines} {dict(sorted(p.by_status.items()))}" for p in progress.values()]
        print("  ... " + " | ".join(with_counts), flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 3.0)


def read_screens(orders_dir: Path) -> dict[str, list[str | Unreadable]]:
    """One screen per ``*.jsonl`` file of ``orders_dir``, named after the file: its lines."""
    if not orders_dir.is_dir():
        message = f"{orders_dir}: no such folder (one JSON-lines file per screen, *.jsonl)"
        raise FileNotFoundError(message)
    files = sorted(orders_dir.glob("*.jsonl"))
    if not files:
        message = f"no *.jsonl order files in {orders_dir} (one file per screen)"
        raise FileNotFoundError(message)
    others = sorted(path.name for path in orders_dir.iterdir() if path.is_file() and path.suffix != ".jsonl")
    if others:
        print(f"weir ice-cream shop: skipping {', '.join(others)} in {orders_dir} (only *.jsonl files are screens)", file=sys.stderr)
    return {path.stem: read_screen_lines(path) for path in files}


async def settled(bootstrap: str, topic: Any, *, timeout_s: float, day: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """Stock and payments once the last commits and deliveries are through (every outcome is out before its
    settlement reaches the kitchen and the payment gateway; after a crash, a peer finishes them).

    Waits until no scoops are reserved and no capture is open, or ``timeout_s``; returns what it read last.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stock = await stock_left(bootstrap, topic)
        # this day's payments only (tickets are <day>/<screen>/<line>): a shop that served another day, within the
        # payments' retention, still holds that day's
        payments = {ticket: payment for ticket, payment in (await payments_by_state(bootstrap, topic)).items() if ticket.startswith(day)}
        busy = any(container["reserved"] for container in stock.values()) or any(p["state"] == "captured" for p in payments.values())
        if not busy or time.monotonic() > deadline:
            return stock, payments
        await asyncio.sleep(1.0)


async def run_shop(
    screens: dict[str, list[str | Unreadable]],
    *,
    bootstrap: str,
    topic_prefix: str,
    timeout_s: float,
    settle_timeout_s: float = 60.0,
    partitions: int = 4,
) -> dict[str, Any]:
    """Serve every screen's lines and gather the reports, the stock, the payments and the dead letters."""

    def topic(name: str) -> str:
        return f"{topic_prefix}{name}"

    progress = {name: ScreenProgress(name, len(lines)) for name, lines in screens.items()}
    stop = asyncio.Event()
    started = time.monotonic()
    async with Screens(bootstrap, topic, partitions=partitions) as shop:
        reporter = asyncio.create_task(_progress(progress, stop))
        try:
            runs = [shop.run_screen(name, lines, progress=progress[name], timeout_s=timeout_s) for name, lines in screens.items()]
            # One screen's failure is its own: the others' reports are kept and printed.
            outcomes = await asyncio.gather(*runs, return_exceptions=True)
            reports = {name: _report_or_failure(outcome) for name, outcome in zip(screens, outcomes, strict=True)}
        finally:
            stop.set()
            await reporter
    elapsed = time.monotonic() - started
    stock, payments = await settled(bootstrap, topic, timeout_s=settle_timeout_s, day=f"{shop.day}/")
    return {
        "reports": reports,
        "progress": progress,
        "elapsed_s": elapsed,
        "stock": stock,
        "payments": payments,
        "dead_letters": await read_to_end(bootstrap, topic("dead-letters"), decode=orjson.loads),
    }


def print_summary(result: dict[str, Any]) -> bool:
    print(f"\nend of day ({result['elapsed_s']:.1f}s)")
    ok = True
    for name, report in result["reports"].items():
        print_report(name, report)
        ok &= report.get("status") == "complete"
    print_latency(result["progress"])
    print("\nstock left")
    for flavour, container in sorted(result["stock"].items()):
        balanced = container["initial"] - container["delivered"] == container["available"] and not container["reserved"]
        ok &= balanced
        print(
            f"  {flavour:<11} opened {container['initial']:>5}  delivered {container['delivered']:>5}  left {container['available']:>5}"
            f"  {'ok' if balanced else 'UNBALANCED: ' + str(container['reserved'])}"
        )
    states = Counter(payment["state"] for payment in result["payments"].values())
    amounts: Counter[str] = Counter()
    for payment in result["payments"].values():
        amounts[payment["state"]] += payment["amount_cents"]
    revenue = sum(report.get("revenue_cents", 0) for report in result["reports"].values())
    money_ok = amounts["committed"] == revenue and states["captured"] == 0
    ok &= money_ok
    print("\npayments")
    print(f"  {dict(states)}; committed {_euros(amounts['committed'])} = revenue {_euros(revenue)}: {'ok' if money_ok else 'MISMATCH'}")
    reasons = Counter(letter["reason"] for letter in result["dead_letters"])
    print(f"  dead letters {len(result['dead_letters'])}: {dict(reasons)}")
    return ok


async def _main(orders_dir: Path, timeout_s: float, *, keep: bool = False) -> int:
    try:
        screens = read_screens(orders_dir)  # before any worker starts: a bad folder fails at once, naming the file
    except (OSError, ValueError) as error:
        print(f"weir ice-cream shop: {error}", file=sys.stderr)
        return 2
    settings = load_settings()
    await check_broker(settings.bootstrap)  # before any worker starts: one line if it cannot be used (see run_main)
    run_id = uuid.uuid4().hex[:6]
    prefix = f"shop-{run_id}."
    env = {**DEMO_ENV, **os.environ, **WORKER_ENV, "WEIR_TOPIC_PREFIX": prefix, "WEIR_APP_ID": f"shop-{run_id}", "PYTHONPATH": str(ROOT)}
    log_dir = Path(tempfile.mkdtemp(prefix=f"weir-shop-{run_id}-"))
    print(f"weir ice-cream shop: screens from {orders_dir}, broker {settings.bootstrap}, topics {prefix}*")
    workers = start_shop_workers(env, log_dir, demo_web_port())
    ok = False
    try:
        async with supervised(workers):
            print("workers ready; the screens open")
            result = await run_shop(
                screens, bootstrap=settings.bootstrap, topic_prefix=prefix, timeout_s=timeout_s, partitions=settings.partitions
            )
            ok = print_summary(result)
        return 0 if ok else 1
    finally:
        if keep or not ok:
            print(f"\ntopics {prefix}* kept; worker logs in {log_dir}")
        else:  # a run leaves nothing behind: its topics (and the app's own, named by its id) and its folder
            await delete_topics(settings.bootstrap, f"shop-{run_id}", client_options=settings.kafka_client_options())
            shutil.rmtree(log_dir, ignore_errors=True)


async def _attach(orders_dir: Path, timeout_s: float) -> int:
    """The screens alone, against a shop whose workers run elsewhere (the compose file's ``shop_screens``): its
    broker, topic prefix and partitions from the settings (``KAFKA_BOOTSTRAP``, ``WEIR_TOPIC_PREFIX``,
    ``WEIR_PARTITIONS``). Starts and deletes nothing; a line sent before its stage's workers joined waits in its topic
    (they read new groups from the beginning)."""
    try:
        screens = read_screens(orders_dir)
    except (OSError, ValueError) as error:
        print(f"weir ice-cream shop: {error}", file=sys.stderr)
        return 2
    settings = load_settings()
    await check_broker(settings.bootstrap)
    print(f"weir ice-cream shop: screens from {orders_dir}, the shop at {settings.bootstrap}, topics {settings.topic_prefix}*")
    result = await run_shop(
        screens, bootstrap=settings.bootstrap, topic_prefix=settings.topic_prefix, timeout_s=timeout_s, partitions=settings.partitions
    )
    return 0 if print_summary(result) else 1


def main() -> None:
    parser = CommandParser(prog="python -m shop.demo", description=__doc__)
    parser.add_argument("--orders", type=Path, default=DEFAULT_ORDERS, help="folder of JSON-lines order files, one per screen")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a customer waits for an outcome before giving up")
    parser.add_argument("--keep", action="store_true", help="keep the run's topics and worker logs (kept anyway when the run fails)")
    parser.add_argument(
        "--attach",
        action="store_true",
        help="run the screens only, against the shop's workers already running (WEIR_TOPIC_PREFIX): start and delete nothing",
    )
    arguments = parser.parse_args()
    if arguments.attach:
        run_main(_attach(arguments.orders, arguments.timeout))
    else:
        run_main(_main(arguments.orders, arguments.timeout, keep=arguments.keep))


if __name__ == "__main__":
    main()
