"""The ice-cream shop end to end: screens, payments, kitchen robots, dispatch barrier, end-of-day reports; no card
number in any record, and no reservation for a rejected card."""

from __future__ import annotations

import asyncio
import base64
import os
import random
import re
import threading
import time
import urllib.request
from collections import Counter
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from scripts.make_shop_orders import order_lines
from shop.catalogue import CATALOGUE_CENTS
from shop.demo import ENTRY, STAGES, WORKER_ENV, run_shop
from shop.state import decision_key, gateway_decision, parse_shop_order
from tests.integration.conftest import Pipeline
from tests.integration.test_eof import last_values
from weir.app.kafka_io import produce, read_to_end, read_topic

#: the shop's and the chaos run's workers load the 2 cores: these modules run one after another in one pytest process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shop")]

SEED = 99
REJECT_RATE = 0.2
SCARCE = 30  # pistachio scoops at opening; only the last screen orders pistachio
SHOP_ENV = {
    "WEIR_SHOP_SEED": SEED,
    "WEIR_SHOP_CARD_REJECT_RATE": REJECT_RATE,
    "WEIR_SHOP_STOCK": 100_000,
    "WEIR_SHOP_STOCK_OVERRIDES": f"pistachio={SCARCE}",
    "WEIR_COMMIT_INTERVAL": 0.1,
    **WORKER_ENV,
}


def make_screens(orders_per_screen: int, seed: int = 5) -> dict[str, list[str]]:
    rng = random.Random(seed)
    return {f"screen-{n}": order_lines(n, orders_per_screen, rng, scarce_screen=n == 3) for n in (1, 2, 3)}


def reference_reports(screens: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """The reports computed sequentially from the files and the seed (the scarce flavour is on one screen); without the
    screen's id (see :func:`comparable`)."""
    reports = {}
    pistachio = SCARCE
    for name, lines in screens.items():
        served = invalid = duplicate = revenue = 0
        aborted: Counter[str] = Counter()
        scoops: Counter[str] = Counter()
        taken: set[str] = set()
        for number, text in enumerate(lines, start=1):
            order, _ = parse_shop_order(text, CATALOGUE_CENTS)
            if order is None:
                invalid += 1
                continue
            if order.order_id in taken:
                duplicate += 1
                continue
            taken.add(order.order_id)
            # the screen's reference carries the Luhn fact; the gateway's draw is keyed by screen, line and order id
            accepted = gateway_decision(order.card, decision_key(name, number, order.order_id), SEED, REJECT_RATE) is None
            wanted = order.scoops.get("pistachio", 0)
            in_stock = wanted <= pistachio
            if accepted and in_stock:
                pistachio -= wanted
                served += 1
                revenue += order.amount_cents
                scoops.update(order.scoops)
            else:
                aborted["card rejected" if not accepted else "out of stock"] += 1
        reports[name] = {
            "status": "complete",
            "batches": len(lines),
            "lines": len(lines),
            "served": served,
            "aborted": sum(aborted.values()),
            "aborted_by_reason": dict(sorted(aborted.items())),
            "invalid": invalid,
            "duplicate": duplicate,
            "revenue_cents": revenue,
            "flavours": {
                flavour: {"scoops": count, "revenue_cents": count * CATALOGUE_CENTS[flavour]} for flavour, count in sorted(scoops.items())
            },
        }
    return reports


def comparable(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Reports without the screen's id (``<day>/<screen>``, the client of the end of day), to compare with the reference."""
    return {name: {key: value for key, value in report.items() if key not in ("screen", "client")} for name, report in reports.items()}


def start_shop(pipeline: Pipeline, **env: Any) -> dict[str, list[Any]]:
    workers: dict[str, list[Any]] = {}
    for agents in STAGES:
        workers.setdefault(agents, []).append(pipeline.start_worker(agents, entry=ENTRY, **SHOP_ENV, **env))
    for group in workers.values():
        for worker in group:
            worker.wait_ready()
    return workers


def assert_invariants(result: dict[str, Any], screens: dict[str, list[str]]) -> None:
    for name, lines in screens.items():
        outcomes = result["progress"][name].outcomes
        assert sorted(outcome["line"] for outcome in outcomes) == list(range(1, len(lines) + 1)), f"{name}: one outcome per line"
        report = result["reports"][name]
        assert report["served"] == sum(1 for outcome in outcomes if outcome["status"] == "ready")
        assert report["invalid"] == sum(1 for outcome in outcomes if outcome["status"] == "invalid")
        assert report["revenue_cents"] == sum(outcome["amount_cents"] for outcome in outcomes)
    payments = result["payments"].values()
    states = Counter(payment["state"] for payment in payments)
    assert states["captured"] == 0, f"captures neither committed nor voided: {states}"
    committed = sum(payment["amount_cents"] for payment in payments if payment["state"] == "committed")
    assert committed == sum(report["revenue_cents"] for report in result["reports"].values()), "money: committed = revenue"
    ready = sum(report["served"] for report in result["reports"].values())
    assert states["committed"] == ready
    for flavour, container in result["stock"].items():
        assert container["reserved"] == {}, f"{flavour}: scoops still reserved"
        assert container["available"] >= 0
        assert container["initial"] - container["delivered"] == container["available"], f"stock of {flavour} does not balance"
    invalid_letters = [letter for letter in result["dead_letters"] if letter["agent"] == "shop_orders"]
    assert len(invalid_letters) == sum(report["invalid"] for report in result["reports"].values())


def assert_outcomes_once_on_the_topic(pipeline: Pipeline, screens: dict[str, list[str]], killed_at_ms: list[int]) -> None:
    """Every record of the outcomes topic, read_committed: one outcome per line, and every kill before the last one.

    The screens keep the first outcome per ticket, so a duplicate would not show in what they report; the topic
    shows it. A kill after the last outcome would test nothing: each must land while orders were in flight.
    """
    records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("shop.outcomes")))
    per_line = Counter((orjson.loads(record.value)["screen"].rsplit("/", 1)[-1], orjson.loads(record.value)["line"]) for record in records)
    expected = {(name, number) for name, lines in screens.items() for number in range(1, len(lines) + 1)}
    assert set(per_line) == expected, f"{len(expected - set(per_line))} lines without an outcome on the topic"
    twice = {line: count for line, count in per_line.items() if count > 1}
    assert not twice, f"outcomes committed more than once: {twice}"
    last_ms = max(record.timestamp for record in records)
    late = [killed for killed in killed_at_ms if killed >= last_ms]
    assert not late, f"{len(late)} of {len(killed_at_ms)} kills came after the last outcome: they hit no work in flight"


def test_a_day_at_the_shop_matches_the_sequential_reference(pipeline: Pipeline) -> None:
    screens = make_screens(40)
    start_shop(pipeline, WEIR_EOF_CLOSED_RETENTION_MS=5_000)  # tombstones go soon: the test sees every key deleted
    result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=90))
    print(f"\n3 screens x 40 lines in {result['elapsed_s']:.1f}s: {result['reports']}")
    assert_invariants(result, screens)
    assert comparable(result["reports"]) == reference_reports(screens)
    assert result["reports"]["screen-3"]["aborted_by_reason"].get("out of stock", 0) > 0, "the scarce flavour ran out"
    assert_the_day_is_cleaned_up(pipeline, [report["screen"] for report in result["reports"].values()])


def assert_the_day_is_cleaned_up(pipeline: Pipeline, screens: list[str], timeout_s: float = 60.0) -> None:
    """Once the screens said "delivered" and the tombstones' retention passed, no stage keeps their day: every
    order-id shard and the end of day's controller, aggregate and join keys are deleted (read_committed, from the
    changelogs). Each held the day before: else the check would prove nothing."""
    tables = ("shop_order_ids", "eof_counters", "eof_totals", "eof_joins")
    deadline = time.monotonic() + timeout_s
    while True:
        values = {table: last_values(pipeline, table) for table in tables}
        left = {table: [key for key, value in rows.items() if value is not None] for table, rows in values.items()}
        if not any(left.values()):
            break
        assert time.monotonic() < deadline, f"keys left {timeout_s}s after the day: {left}"
        time.sleep(1.0)
    claimed = {orjson.loads(key)[0] for key in values["shop_order_ids"]}
    assert set(screens) <= claimed, f"no order id of {sorted(set(screens) - claimed)} was ever claimed: the check proves nothing"
    for table in tables[1:]:
        assert set(screens) <= set(values[table]), f"{table} never held {sorted(set(screens) - set(values[table]))}"


#: The chaos stops killing while this many outcomes are still owed (each kill must hit work in flight).
KILLS_STOP_BEFORE_LAST = 10


@pytest.mark.parametrize(
    ("membership", "kill_every_s", "max_kills"),
    [
        # each kill costs a rebalance after the session timeout, and the restarted worker's join another
        ("dynamic", (12.0, 18.0), 12),
        # a victim restarted in its slot gets its partitions back without a rebalance: kills every few seconds, at most
        # 12 (uncapped, a day on a loaded machine took 30, each a restart and a restore, and the day grew with them;
        # the chaos run kills every stage without a cap)
        ("static", (2.0, 5.0), 12),
    ],
)
def test_sigkill_of_kitchen_and_payment_workers_during_a_day_keeps_every_invariant(
    pipeline: Pipeline, membership: str, kill_every_s: tuple[float, float], max_kills: int
) -> None:
    orders = int(os.environ.get("SHOP_CHAOS_ORDERS", "90")) // 3
    screens = make_screens(orders, seed=8)
    # No order may time out at the barrier while a rebalance holds its partition: the reports must equal the reference.
    # The end of day's idle timeout outlasts an order's longest wait (two barriers' timeouts): a day is not abandoned.
    env = {
        "WEIR_SHOP_DISPATCH_TIMEOUT_MS": 600_000,
        "WEIR_EOF_IDLE_TIMEOUT_MS": 1_800_000,
        "WEIR_STATIC_MEMBERSHIP": int(membership == "static"),
    }
    workers = start_shop(pipeline, **env)
    done = threading.Event()
    kills: list[str] = []
    killed_at_ms: list[int] = []

    total = sum(len(lines) for lines in screens.values())

    def outcomes_out() -> int:
        """The outcomes committed so far: the topic read to its end (a read for a fixed time, half a second, on a loaded
        machine returned before it had read them all, and a kill came after the last outcome)."""
        return len(asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("shop.outcomes"))))

    def chaos() -> None:
        rng = random.Random(3)
        # The first kill as soon as a few outcomes are out (a day of 90 orders may take only about 10 s without
        # faults), then one every kill_every_s: with dynamic members kills closer than about 12 s keep the groups
        # rebalancing. No kill once only the last few outcomes are due: a kill decided on a count read just before the
        # last outcome could land after it, on no work in flight.
        asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic("shop.outcomes"), until=lambda rows: len(rows) >= 5, timeout_s=60))
        wait_s = 0.0
        while len(kills) < max_kills and not done.wait(wait_s):
            wait_s = rng.uniform(*kill_every_s)
            if outcomes_out() >= total - KILLS_STOP_BEFORE_LAST:
                break
            stage = rng.choice(["shop_kitchen", "shop_payments"])
            group = workers[stage]
            victim = group.pop(rng.randrange(len(group)))
            killed_at_ms.append(int(time.time() * 1000))
            victim.kill()
            kills.append(stage)
            # restarted in its slot (its web port, hence its transactional id): it ends the victim's open transaction
            group.append(pipeline.start_worker(stage, web_port=victim.web_port, entry=ENTRY, **SHOP_ENV, **env))

    killer = threading.Thread(target=chaos, daemon=True)
    killer.start()
    try:
        started = time.monotonic()
        result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=180))
    finally:
        done.set()
        killer.join()
    print(f"\n{orders * 3} orders with {len(kills)} SIGKILLs ({Counter(kills)}) in {time.monotonic() - started:.1f}s")
    assert kills, "the run ended before any worker was killed"
    assert_outcomes_once_on_the_topic(pipeline, screens, killed_at_ms)
    assert_invariants(result, screens)
    assert comparable(result["reports"]) == reference_reports(screens)


#: Lines with card numbers where no order can carry them: each must be masked in its dead letter.
CARD_LINES = [
    '{"order_id": "c-1", "card": "4539578763621486", "items": [',  # broken JSON
    '{"order_id": "c-2", "card": "4556 7375 8689 9855", "items": [{"flavour": "durian", "size": "small"}]}',  # not on the menu
    "pay with 5555555555554444 please",  # not JSON at all
    '{"order_id": "c-3", "card": 4916338506082832, "items": [{"flavour": "mint", "size": "small"}]}',  # a number, not a string
    '{"order_id": "c-4", "card": "4111111111111112", "items": [{"flavour": "mint", "size": "small"}]}',  # mistyped: fails Luhn
    # written with dots, with two spaces, and with slashes in a note (each order is not on the menu)
    '{"order_id": "c-5", "card": "4758.3483.2677.5304", "items": [{"flavour": "durian", "size": "small"}]}',
    '{"order_id": "c-6", "card": "4024  0071  5336  0110", "items": [{"flavour": "durian", "size": "small"}]}',
    '{"order_id": "c-7", "card": "4000056655665556", "note": "or 5105/1051/0510/5100", "items": [{"flavour": "durian", "size": "small"}]}',
]

#: what may stand between the digit groups of a card number in the input (shop.cards.CARD_NUMBER masks these too), and
#: so what the scan of the records steps over
CARD_SEPARATORS = " \\-./"


#: Records written straight to the orders topic, not by a screen, that cannot even be decoded: dead-lettered as they
#: came, but for their card numbers (the orders stage's dead-letter redaction). Their keys name no ticket.
RAW_RECORDS = [
    (b"raw-1", b"\xff\xfe binary, card 4929 1234 5678 9012 inside"),  # not UTF-8: its dead letter holds base64
    (b"raw-2 card 4485275742308327", b"card=4485275742308327; not json"),  # in the key too
]


def _dead_letter_bytes(record: Any) -> bytes:
    """A dead letter's original key, value, header values and error as bytes (base64 fields decoded)."""
    try:
        letter = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        return b""
    fields = [letter.get("key"), letter.get("value"), *(raw for _, raw in letter.get("headers") or [])]
    found = [str(letter.get("error", "")).encode()]
    for field in fields:
        if isinstance(field, dict) and field.get("base64"):
            found.append(base64.b64decode(field["base64"]))
    return b"|".join(found)


def _dead_letter_pages(web_port: int) -> list[bytes]:
    """Every page of a worker's dead-letters view, as JSON and as HTML, oldest page last."""
    pages: list[bytes] = []
    before = None
    while len(pages) < 200:
        url = f"http://127.0.0.1:{web_port}/weir/dead-letters/?limit=50" + (f"&before={before}" if before else "")
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "application/json"}), timeout=30) as answer:
            body = answer.read()
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/html"}), timeout=30) as answer:
            pages += [body, answer.read()]
        page = orjson.loads(body)
        before = page.get("before")
        if not before or not page["dead_letters"]:
            return pages
    raise AssertionError("the dead-letters view has more than 100 pages")


def _numbers_in(raw: bytes, numbers: set[str]) -> list[str]:
    """The card ``numbers`` that ``raw`` holds, however their digit groups are separated."""
    text = re.sub(rf"[{CARD_SEPARATORS}]".encode(), b"", raw).decode("utf-8", "replace")
    return [number for number in numbers if number in text]


def _card_numbers(screens: dict[str, list[str]]) -> set[str]:
    """Every card number in the input, as digits: the cards of the orders and the numbers on the other lines."""
    found = set()
    for lines in screens.values():
        for text in lines:
            for run in re.findall(rf"\d(?:[{CARD_SEPARATORS}]{{0,2}}\d){{11,18}}", text):
                digits = re.sub(r"\D", "", run)
                if 12 <= len(digits) <= 19:
                    found.add(digits)
    return found


async def _every_record(bootstrap: str, prefix: str) -> dict[str, list[Any]]:
    """Every record of every topic of the test's deployment (aborted transactions' records too)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = sorted(name for name in await admin.list_topics() if name.startswith(prefix))
    finally:
        await admin.close()
    read = await asyncio.gather(*(read_to_end(bootstrap, name, read_committed=False) for name in names))
    return dict(zip(names, read, strict=True))


def test_no_card_number_in_any_record_and_no_reservation_for_a_rejected_card(pipeline: Pipeline) -> None:
    """A day whose files hold card numbers in orders and in broken lines: no record of any topic (orders, payments,
    kitchen, dispatch, screens, transactions, every changelog, the dead letters) holds one, whole or grouped; and no
    order whose card was rejected (by the Luhn check or by the gateway's draw) ever got a reservation."""
    screens = make_screens(30, seed=12)
    screens["screen-1"] = [*screens["screen-1"], *CARD_LINES]
    numbers = _card_numbers(screens)
    assert len(numbers) > 80, "the input holds the cards of the orders and of the bad lines"
    raw_numbers = _card_numbers({"raw": [(key + b" " + value).decode("utf-8", "replace") for key, value in RAW_RECORDS]})
    assert len(raw_numbers) == 2
    numbers |= raw_numbers
    start_shop(pipeline)
    result = asyncio.run(run_shop(screens, bootstrap=pipeline.bootstrap, topic_prefix=pipeline.prefix, timeout_s=90))
    assert_invariants(result, screens)
    # then, with the shop still open, records no screen wrote (no ticket, so no line's outcome: a dead letter only)
    asyncio.run(produce(pipeline.bootstrap, pipeline.topic("shop.orders"), RAW_RECORDS))

    def raw_letters(rows: list[Any]) -> list[Any]:
        return [row for row in rows if row.value and orjson.loads(row.value)["agent"] == "shop_orders" and b"raw-" in (row.key or b"")]

    dead = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("dead-letters"), until=lambda rows: len(raw_letters(rows)) >= 2, timeout_s=30)
    )
    assert {orjson.loads(row.value)["reason"] for row in raw_letters(dead)} == {"undecodable"}, "each raw record is dead-lettered"
    records = asyncio.run(_every_record(pipeline.bootstrap, pipeline.prefix))
    assert pipeline.topic("dead-letters") in records
    assert pipeline.topic("shop.orders") in records
    leaks = []
    for name, topic_records in records.items():
        for record in topic_records:
            if name == pipeline.topic("shop.orders") and (record.key, record.value) in RAW_RECORDS:
                continue  # what the test itself wrote there, numbers and all
            raw = (record.key or b"") + b"|" + (record.value or b"")
            if name == pipeline.topic("dead-letters"):
                raw += b"|" + _dead_letter_bytes(record)
            leaks += [(name, number) for number in _numbers_in(raw, numbers)]
    assert not leaks, f"{len(leaks)} card numbers in records, e.g. {leaks[:5]}"
    assert sum(len(topic_records) for topic_records in records.values()) > 1000, "the scan read the day's records"
    # nor in what a person reads: the dead-letters view of a worker (every page, JSON and HTML) and the workers' logs
    pages = _dead_letter_pages(pipeline.workers[0].web_port)
    assert sum(page.count(b'"reason"') for page in pages) > 5, "the view showed the day's dead letters"
    logs = [worker.log_text().encode() for worker in pipeline.workers]
    for where, texts in (("the dead-letters view", pages), ("a worker's log", logs)):
        for raw in texts:
            shown = _numbers_in(raw, numbers)
            assert not shown, f"card numbers in {where}: {shown[:5]}"

    outcomes = [outcome for progress in result["progress"].values() for outcome in progress.outcomes]
    rejected = {outcome["ticket"] for outcome in outcomes if (outcome["reason"] or "").startswith("card rejected")}
    invalid_number = [outcome for outcome in outcomes if "Luhn" in (outcome["reason"] or "")]
    assert len(rejected) >= 5, f"rejected cards: {len(rejected)}"
    assert invalid_number, "the mistyped card was rejected by the Luhn check"
    kitchen = [orjson.loads(record.value) for record in records[pipeline.topic("shop.kitchen")] if record.value]
    reserved = {message["order_id"] for message in kitchen if message.get("kind") == "reserve"}
    assert not rejected & reserved, f"rejected cards reached the kitchen: {sorted(rejected & reserved)[:5]}"
    assert not rejected & {message.get("order_id") for message in kitchen}, "the kitchen never heard of a rejected card's order"
    served = {outcome["ticket"] for outcome in outcomes if outcome["status"] == "ready"}
    assert served <= reserved, "every served order was reserved (after its capture)"
