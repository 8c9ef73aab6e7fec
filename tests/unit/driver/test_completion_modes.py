"""Completion modes of a flow's aggregate on the driver: by period for every open group (Camel's
completionInterval), and a group's timeout read from the exchange that opens it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir import Flow, FlowDeclarationError, Settings, TestDriver, payload
from weir.app.testing import START_MS

SETTINGS = Settings(partitions=2, tick_interval_ms=100)
PERIOD_MS = 10_000


def test_every_open_group_completes_at_the_end_of_the_period_together() -> None:
    flow = (
        Flow("clicks", source="clicks")
        .aggregate("batch", correlate_by=payload("user"), timeout_ms=None, complete_interval_ms=PERIOD_MS)
        .to("batches")
    )
    with TestDriver([flow], SETTINGS) as driver:
        to_period_end = PERIOD_MS - START_MS % PERIOD_MS
        driver.pipe("clicks", {"user": "a", "n": 1}, key="a")
        driver.advance(ms=to_period_end - 3_000)
        driver.pipe("clicks", {"user": "b", "n": 2}, key="b")
        driver.pipe("clicks", {"user": "a", "n": 3}, key="a")
        assert driver.values("batches") == []
        driver.advance(ms=3_000 + 500)
        results = {result["correlation_id"]: result for result in driver.values("batches")}
    assert set(results) == {"a", "b"}, "both groups, opened 7 s apart, completed at the same period's end"
    assert {(result["status"], result["reason"]) for result in results.values()} == {("complete", "interval")}
    assert [item["result"]["n"] for item in results["a"]["items"]] == [1, 3]
    assert {result["completed_ms"] // PERIOD_MS for result in results.values()} == {(START_MS + to_period_end) // PERIOD_MS}


def test_a_groups_timeout_is_read_from_the_exchange_that_opens_it() -> None:
    flow = (
        Flow("sessions", source="events")
        .aggregate("session", correlate_by=payload("user"), timeout_ms=60_000, timeout_from=payload("ttl_ms"), groups="reopening")
        .to("sessions-out")
    )
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("events", {"user": "a", "ttl_ms": 2_000}, key="a")
        driver.pipe("events", {"user": "b"}, key="b")  # no ttl: the aggregate's 60 s
        driver.advance(ms=2_500)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a"]
        driver.pipe("events", {"user": "a", "ttl_ms": 5_000}, key="a")  # the key's next group, with its own timeout
        driver.advance(ms=4_000)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a"]
        driver.advance(ms=1_500)
        assert [result["correlation_id"] for result in driver.values("sessions-out")] == ["a", "a"]
        driver.advance(ms=60_000)
        results = driver.values("sessions-out")
    assert [(result["correlation_id"], result["reason"]) for result in results] == [("a", "timeout"), ("a", "timeout"), ("b", "timeout")]


def test_the_new_knobs_are_checked_where_they_are_declared() -> None:
    with pytest.raises(FlowDeclarationError, match="timeout_from belongs to a group by key"):
        Flow("f", source="in").split("s", payload("items")).aggregate("a", timeout_ms=None, timeout_from=payload("t"))
    with pytest.raises(FlowDeclarationError, match="complete_interval_ms must be a positive integer"):
        Flow("g", source="in").aggregate("a", correlate_by=payload("k"), timeout_ms=None, complete_interval_ms=-5)


def _runs(driver: TestDriver, lines: list[tuple[str, int]], *, run: bool = True) -> None:
    """Each line piped (``run=False``: written only, read in one batch by the next ``driver.run()``)."""
    for customer, n in lines:
        driver.pipe("lines", {"customer": customer, "n": n}, key=customer, run=run)


def _batches(driver: TestDriver) -> list[tuple[str, list[int], str]]:
    return [
        (result["correlation_id"], [item["result"]["n"] for item in result["items"]], result["reason"])
        for result in driver.values("batches")
    ]


def _batching(**completion: bool) -> Flow:
    """Lines grouped by customer (reopening keys), completed only the way ``completion`` says."""
    return (
        Flow("lines", source="lines")
        .aggregate("batch", correlate_by=payload("customer"), timeout_ms=None, groups="reopening", **completion)
        .to("batches")
    )


NEW_GROUP_FLOW = _batching(complete_on_new_group=True)


def test_a_group_completes_when_the_next_key_opens_one_in_its_partition() -> None:
    """Camel's completionOnNewCorrelationGroup: keys that come in runs, one group in progress at a time."""
    with TestDriver([NEW_GROUP_FLOW], Settings(partitions=1)) as driver:
        _runs(driver, [("a", 1), ("a", 2), ("b", 3), ("b", 4), ("b", 5), ("a", 6)])
        assert _batches(driver) == [("a", [1, 2], "new-group"), ("b", [3, 4, 5], "new-group")], "a's next run is open"
        _runs(driver, [("c", 7)])
        batches = _batches(driver)
    assert batches[-1] == ("a", [6], "new-group"), "a reopened (groups='reopening') and completed when c came"
    assert {result["status"] for result in driver.values("batches")} == {"complete"}


def test_keys_of_other_partitions_do_not_complete_each_other() -> None:
    from weir.app.kafka_io import key_partition

    keys = [f"k{number}" for number in range(20)]
    first = next(key for key in keys if key_partition(key.encode(), 2) == 0)
    other = next(key for key in keys if key_partition(key.encode(), 2) == 1)
    with TestDriver([NEW_GROUP_FLOW], Settings(partitions=2)) as driver:
        _runs(driver, [(first, 1), (other, 2), (first, 3), (other, 4)])
        assert _batches(driver) == [], "each partition's group stays open: another partition's key is no new group there"
        second = next(key for key in keys if key_partition(key.encode(), 2) == 0 and key != first)
        _runs(driver, [(second, 5)])
        assert _batches(driver) == [(first, [1, 3], "new-group")]


def test_a_crash_between_two_runs_sends_each_batch_once() -> None:
    lines = [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("c", 5), ("a", 6), ("d", 7)]
    expected = [("a", [1, 2], "new-group"), ("b", [3], "new-group"), ("c", [4, 5], "new-group"), ("a", [6], "new-group")]
    for after in range(1, 8):
        with TestDriver([NEW_GROUP_FLOW], Settings(partitions=1)) as driver:
            driver.crash_after(events=after)
            _runs(driver, lines)
            driver.run()
            assert driver.crashes == 1
            assert _batches(driver) == expected, f"a crash after {after} events"


def test_complete_on_new_group_belongs_to_a_group_by_key() -> None:
    with pytest.raises(FlowDeclarationError, match="complete_on_new_group belongs to a group by key"):
        Flow("f", source="in").split("s", payload("items")).aggregate("a", timeout_ms=None, complete_on_new_group=True)
    with pytest.raises(FlowDeclarationError, match="complete_at_batch_end belongs to a group by key"):
        Flow("f", source="in").split("s", payload("items")).aggregate("a", timeout_ms=None, complete_at_batch_end=True)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=25))
def test_with_complete_on_new_group_the_batches_are_the_runs_of_a_key(keys: list[str]) -> None:
    """In one partition, whatever the order of the keys: each maximal run of one key is one batch, in order, and only
    the last run stays open."""
    runs: list[tuple[str, list[int]]] = []
    for number, key in enumerate(keys):
        if runs and runs[-1][0] == key:
            runs[-1][1].append(number)
        else:
            runs.append((key, [number]))
    with TestDriver([NEW_GROUP_FLOW], Settings(partitions=1)) as driver:
        _runs(driver, [(key, number) for number, key in enumerate(keys)])
        batches = _batches(driver)
    assert batches == [(key, numbers, "new-group") for key, numbers in runs[:-1]]


BATCH_FLOW = _batching(complete_at_batch_end=True)


def test_every_group_a_batch_brought_parts_to_completes_at_its_end() -> None:
    """Camel's completionFromBatchConsumer: the records one partition had ready, read as one batch."""
    with TestDriver([BATCH_FLOW], Settings(partitions=1)) as driver:
        _runs(driver, [("a", 1), ("b", 2), ("a", 3)], run=False)
        driver.run()
        first = sorted(_batches(driver))
        _runs(driver, [("a", 4)])  # a batch of its own
        batches = sorted(_batches(driver))
    assert first == [("a", [1, 3], "batch-end"), ("b", [2], "batch-end")]
    assert batches == [("a", [1, 3], "batch-end"), ("a", [4], "batch-end"), ("b", [2], "batch-end")]


def test_a_crash_in_a_batch_leaves_every_line_in_exactly_one_batch() -> None:
    lines = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)]
    for after in range(1, 8):
        with TestDriver([BATCH_FLOW], Settings(partitions=1)) as driver:
            driver.crash_after(events=after)
            _runs(driver, lines, run=False)
            driver.run()
            assert driver.crashes == 1
            batches = _batches(driver)
        assert sorted(n for _, numbers, _ in batches for n in numbers) == [1, 2, 3, 4, 5], f"a crash after {after} events"
        assert all(reason == "batch-end" for _, _, reason in batches)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abc"), min_size=1, max_size=6), min_size=1, max_size=5))
def test_with_complete_at_batch_end_the_results_are_each_batch_grouped_by_key(batches: list[list[str]]) -> None:
    """Against the sequential reference: every batch's lines, grouped by key in their order, one result each."""
    expected: list[tuple[str, list[int], str]] = []
    with TestDriver([BATCH_FLOW], Settings(partitions=1)) as driver:
        n = 0
        for batch in batches:
            lines = []
            for key in batch:
                n += 1
                lines.append((key, n))
            _runs(driver, lines, run=False)
            driver.run()
            for key in dict.fromkeys(batch):
                expected.append((key, [number for customer, number in lines if customer == key], "batch-end"))
        assert sorted(_batches(driver)) == sorted(expected)


INTERVAL_FLOW = _batching(complete_interval_ms=PERIOD_MS)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 2)), min_size=1, max_size=12))
def test_with_complete_interval_every_result_holds_one_keys_lines_of_one_period(arrivals: list[tuple[str, int]]) -> None:
    """Against the reference: the lines of a key that arrived within one period (on the clock) are one result."""
    tick = Settings(partitions=1, tick_interval_ms=100)
    with TestDriver([INTERVAL_FLOW], tick) as driver:
        offset = PERIOD_MS - START_MS % PERIOD_MS + 500  # half a second into a period
        driver.advance(ms=offset)
        periods: dict[tuple[str, int], list[int]] = {}
        for n, (key, wait_s) in enumerate(arrivals, start=1):
            driver.advance(ms=wait_s * 4_000)  # 0, 4 or 8 s: never on a period's end (every 10 s, lines at x.5 s)
            periods.setdefault((key, driver.clock.now_ms() // PERIOD_MS), []).append(n)
            _runs(driver, [(key, n)])
        driver.advance(ms=PERIOD_MS + 1_000)
        assert sorted(_batches(driver)) == sorted((key, numbers, "interval") for (key, _), numbers in periods.items())


TTL_FLOW = (
    Flow("sessions", source="events")
    .aggregate("session", correlate_by=payload("user"), timeout_ms=60_000, timeout_from=payload("ttl_ms"), groups="reopening")
    .to("sessions-out")
)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([1_500, 2_500, 3_500]), st.integers(0, 3)), min_size=1, max_size=10))
def test_with_timeout_from_each_group_lasts_the_timeout_its_opening_exchange_gave(events: list[tuple[str, int, int]]) -> None:
    """Against the reference: a key's group opens with an exchange, holds those until its own ttl, then the next opens."""
    open_groups: dict[str, tuple[int, list[int]]] = {}  # key -> (due, numbers)
    expected: list[tuple[str, list[int]]] = []
    with TestDriver([TTL_FLOW], Settings(partitions=1, tick_interval_ms=100)) as driver:
        for n, (user, ttl, wait_s) in enumerate(events, start=1):
            driver.advance(ms=wait_s * 1_000)  # arrivals on whole seconds, dues on half seconds: never a tie
            now = driver.clock.now_ms()
            for key, (due, numbers) in list(open_groups.items()):
                if due <= now:
                    expected.append((key, numbers))
                    del open_groups[key]
            if user in open_groups:
                open_groups[user][1].append(n)
            else:
                open_groups[user] = (now + ttl, [n])
            driver.pipe("events", {"user": user, "n": n, "ttl_ms": ttl}, key=user)
        expected += [(key, numbers) for key, (_, numbers) in open_groups.items()]
        driver.advance(ms=5_000)
        results = [
            (result["correlation_id"], [item["result"]["n"] for item in result["items"]]) for result in driver.values("sessions-out")
        ]
    assert sorted(results) == sorted(expected)
