"""End of stream per client on the test driver, with the example job and the broker tests' clients
(tests/integration/test_eof.py): many clients at once with exact reports and their cleanup, an idle client, duplicated
messages at every stage, a job of one's own with a poisoned client. The SIGKILL of stages mid-run stays on the broker."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from examples.eof_orders import ORDERS
from tests.integration.eof_jobs import WORDS, word_lines
from tests.integration.test_eof import (
    BATCH_SIZE,
    CLIENT_DATA,
    FLAVOURS,
    MAX_BATCH_ORDERS,
    SHOP_PRICES,
    assert_reports_exact,
    client_lines,
    client_totals,
    make_clients,
)
from weir import Settings, TestDriver
from weir.app.eof_gateway import batched, client_messages, delivered_message
from weir.tables.eof import EofJob, filter_batch


def _settings(**overrides: Any) -> Settings:
    return Settings(partitions=4, eof_max_batch_orders=MAX_BATCH_ORDERS, **overrides)


def _run_at_once(driver: TestDriver, clients: dict[str, list[Any]], side: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every client's batches, side data and end written before any stage runs (all clients at once, interleaved by
    partition), then the stages run; the reports as they came, one per client."""
    messages = {
        client: client_messages(client, lines, batch_size=BATCH_SIZE, side=(side or {}).get(client)) for client, lines in clients.items()
    }
    for batches, _, _ in messages.values():
        for topic, key, value in batches:
            driver.pipe(topic, value, key=key, run=False)
    for _, side_data, end in messages.values():
        for topic, key, value in (side_data, end):
            driver.pipe(topic, value, key=key, run=False)
    driver.run()
    return {record.key: record.value for record in driver.read("eof-reports") if record.key is not None}


def _deliver(driver: TestDriver, clients: dict[str, list[Any]]) -> None:
    for client in clients:
        topic, key, value = delivered_message(client)
        driver.pipe(topic, value, key=key, run=False)
    driver.run()


def _holding(driver: TestDriver, clients: dict[str, list[Any]]) -> dict[str, list[str]]:
    """Per stage table, the clients whose data it holds (more than a tombstone's bookkeeping)."""
    return {
        table: [client for client in clients if any(driver.table(table).get(client, {}).get(field) for field in fields)]
        for table, fields in CLIENT_DATA.items()
    }


def _left(driver: TestDriver) -> dict[str, list[str]]:
    return {table: sorted(driver.table(table)) for table in CLIENT_DATA if driver.table(table)}


def test_twenty_clients_get_exact_reports_and_are_cleaned_up() -> None:
    clients = make_clients(seed=20, count=20)
    # Two clients price with their own lists (one flavour missing: reported unpriced); the others with the catalogue.
    prices = {"screen-1": SHOP_PRICES, "screen-5": SHOP_PRICES}
    with TestDriver(settings=_settings(eof_idle_timeout_ms=30_000, eof_closed_retention_ms=20_000), eof_jobs={"": ORDERS}) as driver:
        reports = _run_at_once(driver, clients, prices)
        assert_reports_exact(reports, clients, prices)
        assert reports["screen-0"]["orders"] == 0
        assert all(report["status"] == "complete" for report in reports.values())
        assert reports["screen-1"]["unpriced"] == [FLAVOURS[0]]
        assert all(report["unpriced"] == [] for client, report in reports.items() if client not in prices)
        held = _holding(driver, clients)
        empty = {"screen-0"}  # drops everything: no totals are ever merged for it
        assert all(set(clients) - empty <= set(held[table]) for table in held), f"every stage held every client's data: {held}"
        _deliver(driver, clients)
        assert _holding(driver, clients) == {key: [] for key in CLIENT_DATA}, "the cleanup broadcast reached every stage"
        driver.advance(seconds=21)
        assert _left(driver) == {}, "no table keeps a finished client's keys once the tombstones' retention passed"


def test_idle_client_is_reported_abandoned() -> None:
    lines = client_lines(random.Random(3), "quiet", 4, 0.0)
    with TestDriver(settings=_settings(eof_idle_timeout_ms=3_000, eof_closed_retention_ms=2_000), eof_jobs={"": ORDERS}) as driver:
        for number, batch in enumerate(batched(lines, BATCH_SIZE)):  # no end: the screen went quiet
            driver.pipe("eof-batches", {"client": "quiet", "batch_id": number, "lines": batch}, key=f"quiet/{number}")
        driver.advance(seconds=2)
        assert driver.read("eof-reports") == []
        driver.advance(seconds=2)
        [report] = driver.values("eof-reports")
        assert report["status"] == "abandoned"
        assert report["batches_sent"] is None
        assert report["batches_reported"] == 4
        driver.advance(seconds=5)
        assert _left(driver) == {}


def test_duplicated_counter_reports_batches_side_data_and_totals_change_nothing() -> None:
    clients = make_clients(seed=7, count=8)
    with TestDriver(settings=_settings(eof_idle_timeout_ms=30_000, eof_closed_retention_ms=15_000), eof_jobs={"": ORDERS}) as driver:
        # The joiner gets each client's side data before the gateway sends it (the same, none: nothing changes); the
        # controller and the aggregator get reports and forwarded batches before the real ones, the filters input
        # batches twice.
        for client, lines in clients.items():
            driver.pipe("eof-join", {"kind": "side", "client": client, "side": None}, key=client, run=False)
            for batch_id, batch in enumerate(batched(lines, BATCH_SIZE)):
                if batch_id % 3:
                    continue
                outcome = filter_batch(batch_id, batch, ORDERS, MAX_BATCH_ORDERS)
                report = {"kind": "filtered", "client": client, "batch_id": batch_id, "forwarded": len(outcome.forwarded)}
                driver.pipe("eof-counter", report, key=client, run=False)
                for out_id, orders in outcome.forwarded:
                    driver.pipe(
                        "eof-aggregate", {"kind": "batch", "client": client, "batch_id": out_id, "records": orders}, key=client, run=False
                    )
                value = {"client": client, "batch_id": batch_id, "lines": batch}
                driver.pipe("eof-batches", value, key=f"{client}/{batch_id}", run=False)
        reports = _run_at_once(driver, clients)
        assert_reports_exact(reports, clients)
        # The aggregator's totals again, twice, once the report is out: the joiner sends no second report.
        for client, lines in clients.items():
            for _ in range(2):
                driver.pipe("eof-join", {"kind": "totals", "client": client, **client_totals(lines)}, key=client, run=False)
        driver.run()
        _deliver(driver, clients)
        for client, lines in clients.items():
            driver.pipe("eof-join", {"kind": "totals", "client": client, **client_totals(lines)}, key=client)  # to the tombstone
        assert Counter(record.value["client"] for record in driver.read("eof-reports")) == dict.fromkeys(clients, 1)
        driver.advance(seconds=16)
        assert _left(driver) == {}


def test_a_job_of_one_s_own_runs_through_the_same_stages_and_a_failing_merge_fails_its_client_alone() -> None:
    """Words counted per client (tests/integration/eof_jobs.py): exact reports, one client's poison record fails that
    client's report (``failed``, with the error) while the others complete, and every stage is cleaned up."""
    rng = random.Random(5)
    clients: dict[str, list[Any]] = {f"reader-{n}": word_lines(rng, 40 + 13 * n) for n in range(4)}
    clients["reader-poisoned"] = [*word_lines(rng, 20), "poison", *word_lines(rng, 20)]
    side = {"reader-1": 3}  # this client's report keeps the words said at least 3 times
    job: EofJob = WORDS
    with TestDriver(settings=_settings(eof_idle_timeout_ms=30_000, eof_closed_retention_ms=2_000), eof_jobs={"": job}) as driver:
        reports = _run_at_once(driver, clients, side)
        poisoned = reports.pop("reader-poisoned")
        assert poisoned["status"] == "failed"
        assert "merge of batch" in poisoned["error"]
        assert "ValueError: poison in the merge" in poisoned["error"]
        healthy = {client: lines for client, lines in clients.items() if client != "reader-poisoned"}
        assert_reports_exact(reports, healthy, side, job=job)
        assert all(report["status"] == "complete" and report["words"] for report in reports.values())
        assert min(reports["reader-1"]["words"].values()) >= 3
        assert all(set(clients) <= set(held) for held in _holding(driver, clients).values())
        _deliver(driver, clients)
        assert _holding(driver, clients) == {key: [] for key in CLIENT_DATA}
        driver.advance(seconds=3)
        assert _left(driver) == {}
