"""`make chaos`: a long shop run with kitchen and payment workers SIGKILLed and restarted, bad inputs injected, and an audit.

    python -m bench.chaos [--orders 2000] [--kill-every 20] [--bad-inputs 300]

Serves ``--orders`` orders over 3 screens (tests/integration/test_shop.py's files, seed and shop settings),
SIGKILLs a random worker of the ``--victims`` stages (default: kitchen and payments; ``all``: every stage) every
``--kill-every`` seconds (about) and starts a new one,
and sends garbage (random bytes, cut JSON, nasty hand-written cases) to the shop's input topics. At the end
a read_committed consumer counts outcomes per ticket and payment transactions per (ticket, phase), and
the money, stock and one-outcome-per-line invariants are checked; the summary table says what held.
The short form (90 orders) is tests/integration/test_shop.py::test_sigkill_of_kitchen_and_payment_workers...
which CI runs; this long form is not run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from shop.demo import ENTRY, run_shop
from shop.screens import latencies_of, latency_ms
from shop.state import SHOP_INPUTS
from tests.integration.conftest import Pipeline
from tests.integration.test_shop import SHOP_ENV, comparable, make_screens, reference_reports, start_shop
from weir.app.kafka_io import client_options_or_env, delete_topics, ensure_topics, read_to_end
from weir.app.processes import Terminated, terminate
from weir.app.settings import load_settings
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_COUNTER, TOPIC_JOIN

#: The shop's input topics (what the screens and the stages send to each other), its end of day's included.
INPUT_TOPICS = (*(f"shop.{name}" for name in SHOP_INPUTS), TOPIC_COUNTER, TOPIC_AGGREGATE, TOPIC_JOIN)
#: Bad inputs that no stage can take for valid: not JSON, not UTF-8, not an object, too deep, a tombstone.
NASTY: list[tuple[bytes | None, bytes | None]] = [
    (b"k", None),
    (b"k", b""),
    (b"k", b"null"),
    (b"k", b"[]"),
    (b"k", b'"a string"'),
    (b"k", b"NaN"),
    (b"k", b"\xff\xfe\x00"),
    (b"k", b'{"kind": "capture", "order_id": '),
    (None, b"[" * 5_000 + b"]" * 5_000),
    (b"\xff" * 64, b'{"kind": "end", "screen": \xff}'),
]


def bad_inputs(count: int, rng: random.Random) -> list[tuple[str, bytes | None, bytes | None]]:
    """(topic, key, value) of ``count`` messages every shop stage must refuse (each one: dead letter)."""
    messages = []
    for number in range(count):
        topic = INPUT_TOPICS[number % len(INPUT_TOPICS)]
        style = number % 3
        if style == 0:
            key, value = NASTY[rng.randrange(len(NASTY))]
        elif style == 1:  # random bytes that do not decode to a JSON object
            value = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
            key = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20))) or None
            if value.strip()[:1] == b"{":
                value = b"\x00" + value
        else:  # a well-formed message cut short
            full = orjson.dumps({"kind": "reserve", "order_id": f"bad-{number}", "flavour": "vanilla", "scoops": 3})
            key, value = f"bad-{number}".encode(), full[: rng.randrange(1, len(full) - 1)]
        messages.append((topic, key, value if value is not None or key is not None else b"?"))
    return messages


async def send_raw(bootstrap: str, messages: list[tuple[str, bytes | None, bytes | None]]) -> list[tuple[str, int, int]]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, **client_options_or_env(None))
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for topic, key, value in messages]
        return [(metadata.topic, metadata.partition, metadata.offset) for metadata in await asyncio.gather(*futures)]
    finally:
        await producer.stop()


def invariant_violations(result: dict[str, Any], screens: dict[str, list[str]]) -> list[str]:
    """The shop's invariants (as tests/integration/test_shop.py checks them), as a list of what broke."""
    broken = []
    for name, lines in screens.items():
        lines_seen = sorted(outcome["line"] for outcome in result["progress"][name].outcomes)
        if lines_seen != list(range(1, len(lines) + 1)):
            broken.append(f"{name}: not one outcome per line")
        report = result["reports"][name]
        if report["revenue_cents"] != sum(outcome["amount_cents"] for outcome in result["progress"][name].outcomes):
            broken.append(f"{name}: report revenue differs from the outcomes")
    payments = list(result["payments"].values())
    states = Counter(payment["state"] for payment in payments)
    if states["captured"]:
        broken.append(f"money: {states['captured']} captures neither committed nor voided")
    committed = sum(payment["amount_cents"] for payment in payments if payment["state"] == "committed")
    revenue = sum(report["revenue_cents"] for report in result["reports"].values())
    if committed != revenue:
        broken.append(f"money: committed {committed} != revenue {revenue}")
    for flavour, container in result["stock"].items():
        if container["reserved"]:
            broken.append(f"stock: {flavour} still reserved")
        if container["available"] < 0:
            broken.append(f"stock: {flavour} below zero")
        if container["initial"] - container["delivered"] != container["available"]:
            broken.append(f"stock: {flavour} does not balance")
    expected = reference_reports(screens)
    for name, report in comparable(result["reports"]).items():
        if report != expected[name]:
            broken.append(f"{name}: report differs from the sequential reference")
    return broken


def audit(bootstrap: str, topic: Any) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Outcomes per ticket and payment transactions per (ticket, phase), as a read_committed consumer sees them."""
    outcomes = asyncio.run(read_to_end(bootstrap, topic("shop.outcomes")))
    transactions = asyncio.run(read_to_end(bootstrap, topic("shop.transactions")))
    per_ticket = Counter(record.key.decode() for record in outcomes)
    per_phase = Counter((value["order_id"], value["phase"]) for value in (orjson.loads(record.value) for record in transactions))
    twice = [record for record in outcomes if per_ticket[record.key.decode()] > 1]
    if twice:  # where and when each copy was written: the evidence a failing run leaves in its output
        print(f"outcomes written more than once ({len(twice)} records), first ones: (ticket, partition, offset, timestamp ms)")
        for record in twice[:20]:
            print(f"  {record.key.decode()} p{record.partition} o{record.offset} t{record.timestamp}")
    return per_ticket, per_phase


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=2000, help="orders over the 3 screens (default 2000)")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between SIGKILLs, about (default 5)")
    parser.add_argument("--bad-inputs", type=int, default=300, help="garbage messages injected during the run (default 300)")
    parser.add_argument("--seed", type=int, default=8, help="seed of the order files and of the chaos")
    parser.add_argument(
        "--victims",
        default="all",
        help="comma list of the stages whose workers are SIGKILLed (default 'all': every stage, the orders+claims,"
        " dispatch and end-of-day workers included; e.g. shop_kitchen,shop_payments for those two only)",
    )
    parser.add_argument(
        "--guarantee",
        choices=["exactly_once", "at_least_once"],
        default="exactly_once",
        help="processing guarantee of every worker (at_least_once: duplicates are counted, not a failure)",
    )
    membership = parser.add_mutually_exclusive_group()
    membership.add_argument(
        "--static-membership",
        dest="static_membership",
        action="store_true",
        default=True,
        help="workers join their groups as static members (WEIR_STATIC_MEMBERSHIP=1, the default): a victim restarted"
        " in its slot gets its partitions back without a rebalance",
    )
    membership.add_argument(
        "--dynamic-membership",
        dest="static_membership",
        action="store_false",
        help="workers join as dynamic members (WEIR_STATIC_MEMBERSHIP=0): every kill and restart rebalances the stage's group",
    )
    parser.add_argument("--summary", type=Path, help="also write the figures as JSON to this file (for tests)")
    parser.add_argument("--keep", action="store_true", help="keep the run's topics and worker logs (kept anyway when it fails)")
    arguments = parser.parse_args(argv)

    settings = load_settings()
    unique = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"weir-chaos-{unique}-"))
    pipeline = Pipeline(bootstrap=settings.bootstrap, tmp=tmp, prefix=f"chaos{unique}.", app_id=f"chaos{unique}")
    _running.append(pipeline)
    screens = make_screens(arguments.orders // 3, seed=arguments.seed)
    orders = sum(len(lines) for lines in screens.values())
    rng = random.Random(arguments.seed)
    print(
        f"weir chaos: {orders} orders over {len(screens)} screens, a SIGKILL every ~{arguments.kill_every}s, "
        f"{arguments.guarantee}, {'static' if arguments.static_membership else 'dynamic'} members, broker {pipeline.bootstrap}"
    )
    print(f"  topics {pipeline.prefix}*, worker logs in {tmp}")
    env = {
        "WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000,
        "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000,  # a screen's day outlasts an order's longest wait (two barriers)
        # settled payments expire after the done retention: the audit's money check reads every payment of the run
        "WEIR_DONE_RETENTION_MS": 6 * 3_600_000,
        "WEIR_GUARANTEE": arguments.guarantee,
        "WEIR_STATIC_MEMBERSHIP": int(arguments.static_membership),
    }
    workers = start_shop(pipeline, **env)
    # a stage is named by any agent it runs ("shop_orders" is the orders+claims worker, "eof_controller" the end of day's)
    wanted = {name.strip() for name in arguments.victims.split(",") if name.strip()}
    victims = [stage for stage in workers if arguments.victims == "all" or wanted & set(stage.split(","))]
    unknown = sorted(wanted - {agent for stage in workers for agent in stage.split(",")} - {"all"})
    if unknown or not victims:
        parser.error(f"--victims: unknown stage(s) {unknown}, expected agents of {sorted(workers)} or 'all'")
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in INPUT_TOPICS], settings.partitions))
    done = threading.Event()
    kills: Counter[str] = Counter()
    garbage = bad_inputs(arguments.bad_inputs, rng)
    garbage_positions: list[tuple[str, int, int]] = []

    def chaos() -> None:
        chunks = [garbage[start : start + 10] for start in range(0, len(garbage), 10)]
        cycle: list[str] = []
        while not done.wait(rng.uniform(0.75, 1.25) * arguments.kill_every):
            if not cycle:  # every victim stage once per round, in a shuffled order: each is hit early in a run
                cycle.extend(rng.sample(victims, len(victims)))
            stage = cycle.pop()
            group = workers[stage]
            victim = group.pop(rng.randrange(len(group)))
            victim.kill()
            kills[stage] += 1
            # restarted in its slot (its web port, hence its transactional id): it ends the victim's open transaction
            group.append(pipeline.start_worker(stage, web_port=victim.web_port, entry=ENTRY, **SHOP_ENV, **env))
            if chunks:
                batch = [(pipeline.topic(name), key, value) for name, key, value in chunks.pop()]
                garbage_positions.extend(asyncio.run(send_raw(pipeline.bootstrap, batch)))
        for chunk in chunks:  # what the run was too short to inject
            garbage_positions.extend(asyncio.run(send_raw(pipeline.bootstrap, [(pipeline.topic(n), k, v) for n, k, v in chunk])))

    killer = threading.Thread(target=chaos, daemon=True)
    started = time.monotonic()
    lost_by_timeout = 0
    result: dict[str, Any] | None = None
    try:
        killer.start()
        try:
            result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=240))
        except TimeoutError:
            lost_by_timeout = 1
        elapsed = time.monotonic() - started
        done.set()
        killer.join()
        time.sleep(3.0)  # the garbage's dead letters commit
        per_ticket, per_phase = audit(pipeline.bootstrap, pipeline.topic)
        letters = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dead-letters")))
    finally:
        done.set()
        pipeline.stop_all()

    tickets = {f"{name}/{number}" for name, lines in screens.items() for number in range(1, len(lines) + 1)}
    seen_tickets = {ticket.split("/", 1)[1] for ticket in per_ticket}  # "<day>/<screen>/<line>" without the day
    lost = len(tickets - seen_tickets) + lost_by_timeout
    duplicated = sum(count - 1 for count in per_ticket.values() if count > 1) + sum(count - 1 for count in per_phase.values() if count > 1)
    origins = {tuple(orjson.loads(record.value)["origin"][field] for field in ("topic", "partition", "offset")) for record in letters}
    refused = sum(1 for position in garbage_positions if position in origins)
    violations = invariant_violations(result, screens) if result is not None else ["the run did not finish"]
    latencies = latencies_of(result["progress"]) if result is not None else []
    p50, p99 = latency_ms(latencies, 0.5), latency_ms(latencies, 0.99)
    rows = [
        ("load held", f"{orders} orders in {elapsed:.1f}s = {orders / elapsed:.1f} orders/s over {len(screens)} screens"),
        ("faults injected", f"{sum(kills.values())} SIGKILLs: " + ", ".join(f"{stage} {count}" for stage, count in sorted(kills.items()))),
        ("bad inputs tried", f"{len(garbage_positions)}, dead-lettered {refused}"),
        ("per-order latency", "-" if p50 is None or p99 is None else f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms (kills included)"),
        ("lost", str(lost)),
        ("guarantee", arguments.guarantee),
        ("duplicated", f"{duplicated} (outcomes per ticket, transactions per (ticket, phase), read_committed)"),
        ("invariant violations", str(len(violations)) + (": " + "; ".join(violations[:5]) if violations else "")),
    ]
    print("\n| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    # at_least_once promises no loss, not no duplicates: its duplicates are reported, the invariants must hold.
    once = duplicated == 0 or arguments.guarantee == "at_least_once"
    ok = lost == 0 and once and not violations and refused == len(garbage_positions)
    if arguments.summary is not None:
        summary = {
            "orders": orders,
            "elapsed_s": elapsed,
            "kills": dict(kills),
            "bad_inputs": len(garbage_positions),
            "dead_lettered": refused,
            "lost": lost,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "duplicated": duplicated,
            "violations": violations,
            "ok": ok,
        }
        arguments.summary.write_text(orjson.dumps(summary).decode())
    if ok and not arguments.keep:  # nothing left behind: the run's topics, the apps' own, and the worker logs
        asyncio.run(delete_topics(pipeline.bootstrap, f"chaos{unique}"))
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


#: The deployments this process started, stopped on Ctrl-C or SIGTERM wherever the run was.
_running: list[Pipeline] = []

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, terminate)
    try:
        sys.exit(main())
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (a timeout, a CI runner): no worker is left behind
        for deployment in _running:
            deployment.stop_all()
        print("\nstopped: workers stopped", flush=True)
        sys.exit(143 if isinstance(interrupt, Terminated) else 130)
