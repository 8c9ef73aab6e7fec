"""A day at the shop on weir's test driver: the shop's four stages, its dispatch flows and its end-of-day job in one
process, on the workers' own code, with the screens' side played by the test (a line, its outcome, the next line;
then the side data, "sent N", the report, "delivered").

What a broker run of the same day checks (tests/integration/test_shop.py) is checked here without one: each
screen's report equals the one computed sequentially from its lines and the seed; every line gets one outcome,
read committed, also when the workers crash mid-day (the round rolled back, its inputs read again); and the day
leaves no state behind once delivered and its tombstones' retention passed. The broker tests keep what only a
broker shows: SIGKILLed processes, rebalances, the screens' own client.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from shop.cards import protect_line
from shop.day import DAY
from shop.flows import FLOWS
from shop.settings import ShopSettings
from shop.stages import ShopStages
from tests.integration.test_shop import REJECT_RATE, SCARCE, SEED, comparable, make_screens, reference_reports
from weir import Settings, TestDriver

CARD_KEY = b"unit-test-card-key"
DAY_ID = "2026-12-03"
RETENTION_MS = 5_000


def shop_driver() -> TestDriver:
    shop = ShopSettings(card_reject_rate=REJECT_RATE, seed=SEED, stock=100_000, stock_overrides=(("pistachio", SCARCE),))
    settings = Settings(partitions=2, eof_closed_retention_ms=RETENTION_MS, done_retention_ms=RETENTION_MS)
    return TestDriver(FLOWS, settings, eof_jobs={"": DAY}, topologies=[lambda wiring: ShopStages(wiring, shop)])


def serve_day(driver: TestDriver, screens: dict[str, list[str]], crash_every: int | None = None) -> dict[str, dict[str, Any]]:
    """Each screen's customers in turn (a screen sends a line once the one before it has its outcome), then its end of
    day; ``crash_every``: a crash after that many more events, again and again (each rolls the round back)."""
    reports: dict[str, dict[str, Any]] = {}
    for name, lines in screens.items():
        screen = f"{DAY_ID}/{name}"
        for number, text in enumerate(lines, start=1):
            ticket = f"{screen}/{number}"
            if crash_every:
                driver.crash_after(events=crash_every)
            driver.pipe(
                "shop.orders", {"ticket": ticket, "screen": screen, "line": number, "text": protect_line(text, CARD_KEY)}, key=ticket
            )
            assert any(outcome["ticket"] == ticket for outcome in driver.values("shop.outcomes")), f"{ticket}: no outcome"
        driver.pipe("eof-join", {"kind": "side", "client": screen, "side": None}, key=screen)
        driver.pipe("eof-counter", {"kind": "sent", "client": screen, "batches": len(lines)}, key=screen)
        (report,) = [record.value for record in driver.read("eof-reports") if record.key == screen]
        driver.pipe("eof-counter", {"kind": "delivered", "client": screen}, key=screen)
        reports[name] = report
    return reports


def test_a_day_at_the_shop_matches_the_sequential_reference_and_leaves_nothing_behind() -> None:
    screens = make_screens(40)
    with shop_driver() as driver:
        reports = serve_day(driver, screens)
        assert comparable(reports) == reference_reports(screens)
        assert reports["screen-3"]["aborted_by_reason"].get("out of stock", 0) > 0, "the scarce flavour ran out"
        per_line = Counter((outcome["screen"], outcome["line"]) for outcome in driver.values("shop.outcomes"))
        assert set(per_line.values()) == {1}
        assert len(per_line) == sum(len(lines) for lines in screens.values())
        payments = Counter(payment["state"] for payment in driver.table("shop_payments").values())
        assert payments["captured"] == 0, f"every capture committed or voided: {payments}"
        assert payments["committed"] == sum(report["served"] for report in reports.values())
        assert all("deadline_ms" in message for message in driver.values("shop.kitchen")), "every kitchen message has its deadline"
        late = [letter["reason"] for letter in driver.dead_letters() if letter["reason"] in ("late-capture", "late-reservation")]
        assert late == [], "no capture or reservation in time is refused as late"

        per_order = ("shop_order_ids", "shop_payments", "shop_kitchen_settled", "eof_counters", "eof_totals", "eof_joins")
        held = {table: len(driver.table(table)) for table in per_order}
        assert all(held.values()), f"each table held the day before its retention: {held}"
        # a payment is kept for the retention after its order's deadline too (the dispatch timeout after its claim)
        driver.advance(ms=ShopSettings().dispatch_timeout_ms + RETENTION_MS + 2 * driver.settings.tick_interval_ms + 1_000)
        left = {table: sorted(driver.table(table)) for table in held}
        assert not any(left.values()), f"keys left after the day and its tombstones' retention: {left}"


@pytest.mark.parametrize("crash_every", [3, 7, 17])
def test_crashes_all_day_long_change_no_report_and_answer_each_line_once(crash_every: int) -> None:
    screens = make_screens(12, seed=8)
    with shop_driver() as driver:
        reports = serve_day(driver, screens, crash_every=crash_every)
        assert driver.crashes >= sum(len(lines) for lines in screens.values()) // 2, f"only {driver.crashes} crashes"
        assert comparable(reports) == reference_reports(screens)
        per_line = Counter((outcome["screen"], outcome["line"]) for outcome in driver.values("shop.outcomes"))
        assert set(per_line.values()) == {1}, [line for line, count in per_line.items() if count > 1][:5]
        transactions = Counter((record["order_id"], record["phase"]) for record in driver.values("shop.transactions"))
        assert set(transactions.values()) == {1}, "each payment phase logged once"
