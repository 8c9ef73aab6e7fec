"""End-of-stream jobs on the test driver: reports per client, several jobs in one deployment, cleanup, crashes, idle clients."""

from __future__ import annotations

from typing import Any

from weir import Dropped, EofJob, Settings, TestDriver

SETTINGS = Settings(partitions=3, eof_max_batch_orders=3, eof_idle_timeout_ms=60_000, eof_closed_retention_ms=10_000)


def _keep_text(record: object) -> str:
    if not isinstance(record, str) or not record.strip():
        raise Dropped("not a line of text")
    return record.lower()


def _count_words(totals: dict[str, int], record: str) -> dict[str, int]:
    for word in record.split():
        totals[word] = totals.get(word, 0) + 1
    return totals


#: Words counted per client; the report lists those said at least ``side`` times.
WORDS = EofJob(
    "words",
    select=_keep_text,
    zero=dict,
    merge=_count_words,
    join=lambda client, totals, side: {"words": {word: n for word, n in sorted(totals.items()) if n >= (side or 1)}},
)
#: Numbers summed per client (a record that is not a number is dropped).
SUMS = EofJob(
    "sums",
    select=lambda record: record if isinstance(record, int) and not isinstance(record, bool) else _drop(record),
    zero=lambda: 0,
    merge=lambda total, record: total + record,
    join=lambda client, total, side: {"sum": total},
)


def _drop(record: object) -> Any:
    raise Dropped(f"{record!r} is not a number")


LINES = ["the cat", "", "The dog and the cat", 7, "a bird", "the end"]


def _nonempty(driver: TestDriver) -> dict[str, dict[str, Any]]:
    return {name: table for name in driver.tables() if (table := driver.table(name)) and not name.endswith("deadlines")}


def test_a_client_s_report_counts_each_kept_record_once_and_the_cleanup_leaves_only_tombstones() -> None:
    with TestDriver(settings=SETTINGS, eof_jobs={"": WORDS}) as driver:
        report = driver.eof_client("c-1", LINES, batch_size=2)
        assert report is not None
        assert report["status"] == "complete"
        assert report["batches"] == 3
        assert report["words"] == {"a": 1, "and": 1, "bird": 1, "cat": 2, "dog": 1, "end": 1, "the": 4}
        # after "delivered", every stage keeps only the client's tombstone, until its retention ends
        for name, table in _nonempty(driver).items():
            assert set(table) == {"c-1"}, name
            assert table["c-1"].get("closed_ms") is not None, f"{name}: a tombstone, not the client's state"
        driver.advance(seconds=12)
        assert _nonempty(driver) == {}, "no table keeps a finished client's keys"


def test_two_jobs_in_one_deployment_keep_their_clients_apart() -> None:
    with TestDriver(settings=SETTINGS, eof_jobs={"words": WORDS, "sums": SUMS}) as driver:
        words = driver.eof_client("c-1", LINES, job="words", batch_size=4)
        sums = driver.eof_client("c-1", [1, 2, "x", 39], job="sums", batch_size=1)
        assert words is not None
        assert sums is not None
        assert (words["status"], words["words"]["the"]) == ("complete", 4)
        assert (sums["status"], sums["sum"], sums["batches"]) == ("complete", 42, 3)  # the batch of "x" forwarded nothing
        assert "words-eof_totals" in driver.tables()
        assert "sums-eof_totals" in driver.tables()
        assert driver.read("words.eof-reports")[0].value["words"] == words["words"]
        assert driver.read("eof-reports") == [], "the unnamed job's topics are not used"


def test_a_crash_anywhere_in_the_protocol_gives_the_same_report_once() -> None:
    with TestDriver(settings=SETTINGS, eof_jobs={"": WORDS}) as reference:
        expected = reference.eof_client("c-1", LINES, batch_size=1)
        handled = reference.events_handled
    assert handled > 20
    for crash_at in range(1, handled):
        with TestDriver(settings=SETTINGS, eof_jobs={"": WORDS}) as driver:
            driver.crash_after(crash_at)
            report = driver.eof_client("c-1", LINES, batch_size=1)
            assert driver.crashes == 1
            assert [record.key for record in driver.read("eof-reports")] == ["c-1"], f"one report (a crash after {crash_at} events)"
        assert report == expected, f"a crash after {crash_at} events"


def test_a_client_that_never_says_how_many_batches_is_reported_abandoned_after_the_idle_timeout() -> None:
    with TestDriver(settings=SETTINGS, eof_jobs={"": WORDS}) as driver:
        driver.pipe("eof-batches", {"client": "c-2", "batch_id": 0, "lines": ["hello"]}, key="c-2/0")
        driver.advance(seconds=59)
        assert driver.read("eof-reports") == []
        driver.advance(seconds=2)
        [report] = driver.values("eof-reports")
        assert (report["client"], report["status"]) == ("c-2", "abandoned")


def test_a_batch_that_is_not_an_object_is_dead_lettered_and_still_reported_to_the_controller() -> None:
    with TestDriver(settings=SETTINGS, eof_jobs={"": WORDS}) as driver:
        driver.pipe("eof-batches", ["not", "a", "batch"], key="c-3/0")
        driver.pipe("eof-batches", {"client": "c-3", "batch_id": 1, "lines": ["one word"]}, key="c-3/1")
        driver.pipe("eof-join", {"kind": "side", "client": "c-3", "side": None}, key="c-3")
        driver.pipe("eof-counter", {"kind": "sent", "client": "c-3", "batches": 2}, key="c-3")
        [letter] = driver.dead_letters()
        assert (letter["agent"], letter["reason"]) == ("eof_filter", "invalid")
        [report] = driver.values("eof-reports")
        assert (report["status"], report["words"]) == ("complete", {"one": 1, "word": 1})


#: Seed 000's task 1: the filter answers the gateway; the report holds every kept record, in batch order.
LONG_WORDS = EofJob.answered_by_filter(
    "long-words", select=lambda record: record if isinstance(record, str) and len(record) > 5 else _drop(record)
)


def test_a_job_answered_by_its_filter_reports_every_kept_record_in_order_and_runs_no_aggregate() -> None:
    lines = ["a", "cathedral", "longer one", "b", "x", "y", "splendid", "zz", "wonderful day", "elephant"]
    with TestDriver(settings=SETTINGS, eof_jobs={"long": LONG_WORDS, "words": WORDS}) as driver:
        report = driver.eof_client("c-1", lines, job="long", batch_size=2)
        words = driver.eof_client("c-1", LINES, job="words", batch_size=2)
        assert report is not None
        assert words is not None
        assert report["status"] == "complete"
        assert report["records"] == ["cathedral", "longer one", "splendid", "wonderful day", "elephant"]
        assert (report["batches_sent"], report["batches_forwarded"]) == (5, 4)  # batch 2 ("x", "y") forwarded nothing
        assert words["words"]["the"] == 4, "the other task, on the same stages, is untouched"
        kinds = [record.value.get("kind") for record in driver.read("long.eof-reports")]
        assert sorted(kinds) == ["end"] + ["part"] * 4
        assert not any(name.startswith("long-eof_totals") or name.startswith("long-eof_joins") for name in driver.tables())
        driver.advance(seconds=12)
        assert {name: table for name, table in _nonempty(driver).items() if name.startswith("long")} == {}


def test_a_job_answered_by_its_filter_gives_the_same_report_through_crashes() -> None:
    lines = [f"record-{number:03}" if number % 3 else "x" for number in range(40)]
    with TestDriver(settings=SETTINGS, eof_jobs={"long": LONG_WORDS}) as reference:
        expected = reference.eof_client("c-1", lines, job="long", batch_size=3)
    assert expected is not None
    for every in (1, 3, 7):
        with TestDriver(settings=SETTINGS, eof_jobs={"long": LONG_WORDS}) as driver:
            driver.crash_after(every)
            report = driver.eof_client("c-1", lines, job="long", batch_size=3)
            assert report == expected, f"a crash every {every} events"


def test_a_worker_serves_no_aggregate_or_join_for_a_job_answered_by_its_filter() -> None:
    from weir import Application
    from weir.agents import eof_aggregator, eof_controller, eof_filter, eof_joiner

    application = Application(Settings(app_id="unit-eof-agents"), eof_jobs={"long": LONG_WORDS, "words": WORDS})
    names = {
        module.__name__.rpartition(".")[2]: [stage.name for stage in module.stages(application)]
        for module in (eof_filter, eof_controller, eof_aggregator, eof_joiner)
    }
    assert len(names["eof_filter"]) == len(names["eof_controller"]) == 2
    assert len(names["eof_aggregator"]) == len(names["eof_joiner"]) == 1
    assert all("words" in name for name in names["eof_aggregator"] + names["eof_joiner"])
