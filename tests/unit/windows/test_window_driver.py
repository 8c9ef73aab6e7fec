"""Windowed aggregations on the test driver: event time, stream time per partition, grace, late records, emit modes,
crashes; weir's public names, and the loader of WEIR_WINDOWS."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from weir import SessionSpec, Settings, TestDriver, Window, WindowSpec, count, total


def clicks(emit: str = "final", spec: WindowSpec | None = None) -> Window:
    return Window("clicks", source="clicks", to="click-counts", spec=spec or WindowSpec.tumbling(1_000, grace_ms=200), emit=emit)  # type: ignore[arg-type]


def driver(*windows: Window, partitions: int = 1) -> TestDriver:
    return TestDriver(settings=Settings(partitions=partitions), windows=windows)


def finals(test: TestDriver, topic: str = "click-counts") -> dict[tuple[str, int], Any]:
    results = [value for value in test.values(topic) if value["final"]]
    found = Counter((value["key"], value["start_ms"]) for value in results)
    assert set(found.values()) <= {1}, f"a window's final result went out more than once: {found}"
    return {(value["key"], value["start_ms"]): value["value"] for value in results}


def test_a_tumbling_count_goes_out_once_per_window_when_stream_time_passes_its_end_and_grace() -> None:
    with driver(clicks()) as test:
        for stamp in (0, 100, 999, 1_000, 1_150):
            test.pipe("clicks", {"page": "/"}, key="u1", timestamp_ms=stamp)
        assert finals(test) == {}, "window [0, 1000) is open until stream time 1200"
        test.pipe("clicks", {"page": "/"}, key="u1", timestamp_ms=1_200)
        assert finals(test) == {("u1", 0): 3}
        assert test.values("click-counts")[0] == {"key": "u1", "start_ms": 0, "end_ms": 1_000, "value": 3, "count": 3, "final": True}
        test.pipe("clicks", {"page": "/"}, key="u2", timestamp_ms=2_500)  # another key moves the partition's stream time
        assert finals(test) == {("u1", 0): 3, ("u1", 1_000): 3}
        assert test.table("window-clicks") == {"u2": {"open": [[2_000, 1, 1]]}}, "closed windows leave no state"


def test_a_record_within_the_grace_counts_and_one_after_it_is_dead_lettered_as_late() -> None:
    with driver(clicks()) as test:
        test.pipe("clicks", {}, key="u1", timestamp_ms=500)
        test.pipe("clicks", {}, key="u1", timestamp_ms=1_100)  # stream time 1100: [0, 1000) still takes records
        test.pipe("clicks", {}, key="u1", timestamp_ms=900)  # out of order, within the grace
        test.pipe("clicks", {}, key="u1", timestamp_ms=1_300)  # stream time 1300: [0, 1000) closes with 2
        test.pipe("clicks", {}, key="u1", timestamp_ms=950)  # too late: dropped
        assert finals(test) == {("u1", 0): 2}
        (letter,) = test.dead_letters()
        assert (letter["reason"], letter["agent"]) == ("late", "window-clicks")
        assert "late for [0]" in letter["error"]


def test_hopping_windows_take_a_record_in_each_window_that_holds_it() -> None:
    hopping = WindowSpec.hopping(1_000, 500)
    with driver(Window("sums", source="sales", to="sales-sums", spec=hopping, fold=total("cents"))) as test:
        for stamp, cents in ((100, 1), (600, 10), (1_200, 100)):
            test.pipe("sales", {"cents": cents}, key="shop", timestamp_ms=stamp)
        test.pipe("sales", {"cents": 1_000}, key="shop", timestamp_ms=3_000)
        # stream time 3000 closed [0,1000) [500,1500) [1000,2000); [1500,2500) had no record, [2500,3500) is open
        assert finals(test, "sales-sums") == {("shop", 0): 11, ("shop", 500): 110, ("shop", 1_000): 100}


def test_emit_update_sends_each_window_on_every_record_then_its_final_result() -> None:
    with driver(clicks(emit="update")) as test:
        for stamp in (10, 20, 1_300):
            test.pipe("clicks", {}, key="u1", timestamp_ms=stamp)
        updates = [(value["start_ms"], value["value"], value["final"]) for value in test.values("click-counts")]
        assert updates == [(0, 1, False), (0, 2, False), (1_000, 1, False), (0, 2, True)]


def test_the_event_time_may_come_from_the_value() -> None:
    window = Window("orders", source="orders", to="per-minute", spec=WindowSpec.tumbling(60_000), timestamp=lambda value: value["at"])
    with driver(window) as test:
        for at in (1_000, 59_000, 61_000, 125_000):
            test.pipe("orders", {"at": at}, key="k")  # piped "now": the record's own timestamp is not read
        test.pipe("orders", {"at": "soon"}, key="k")
        assert finals(test, "per-minute") == {("k", 0): 2, ("k", 60_000): 1}
        assert [letter["reason"] for letter in test.dead_letters()] == ["invalid"]


def test_stream_time_is_each_partitions_own() -> None:
    with driver(clicks(), partitions=2) as test:
        test.pipe("clicks", {}, key="a", partition=0, timestamp_ms=100)
        test.pipe("clicks", {}, key="b", partition=1, timestamp_ms=100)
        test.pipe("clicks", {}, key="b", partition=1, timestamp_ms=5_000)
        assert finals(test) == {("b", 0): 1}, "partition 0 read nothing past 100: its window stays open"
        assert test.table("window-clicks-time") == {"0": 100, "1": 5_000}


@pytest.mark.parametrize("seed", range(4))
def test_a_crash_anywhere_changes_no_result_and_sends_none_twice(seed: int) -> None:
    rng = random.Random(seed)
    records = [(rng.choice("abcd"), max(0, stamp * 37 + rng.randint(-1_500, 1_500))) for stamp in range(200)]
    spec = WindowSpec.hopping(1_000, 250, grace_ms=250)

    def run(crash_every: int | None) -> tuple[dict[tuple[str, int], Any], list[str], int]:
        with driver(Window("w", source="in", to="out", spec=spec), partitions=2) as test:
            for key, stamp in records:
                if crash_every:
                    test.crash_after(events=crash_every)
                test.pipe("in", {}, key=key, timestamp_ms=stamp, run=False)
                if rng.random() < 0.2:
                    test.run()
            test.run()
            return finals(test, "out"), sorted(letter["error"] for letter in test.dead_letters()), test.crashes

    expected, late, _ = run(None)
    results, late_after_crashes, crashes = run(rng.randint(2, 9))
    assert crashes > 3
    assert results == expected
    assert late_after_crashes == late
    assert len(expected) > 20, "the scenario closes many windows"
    assert late, "and has records too late for every window of theirs"


def test_declarations_are_checked_where_they_are_made() -> None:
    with pytest.raises(ValueError, match="leaves gaps"):
        WindowSpec.hopping(1_000, 2_000)
    with pytest.raises(ValueError, match="positive"):
        WindowSpec.tumbling(0)
    with pytest.raises(ValueError, match="a name holds"):
        Window("no spaces", source="a", to="b", spec=WindowSpec.tumbling(10))
    with pytest.raises(ValueError, match="names must differ"):
        driver(clicks(), clicks())


def test_weir_windows_names_modules_that_define_windows() -> None:
    from weir.app.windows import load_windows

    (window,) = load_windows("tests.integration.window_defs")
    assert (window.name, window.spec) == ("clicks", WindowSpec.tumbling(1_000, grace_ms=500))
    with pytest.raises(ValueError, match="WEIR_WINDOWS names no module"):
        load_windows(" ")
    with pytest.raises(ValueError, match="must define WINDOWS"):
        load_windows("tests.integration.split_flows")


def test_the_web_views_and_metrics_show_open_windows_and_stream_time() -> None:
    from weir.app.metrics import table_gauge_for
    from weir.app.web import view_for

    with driver(clicks()) as test:
        for stamp in (100, 900, 1_100):
            test.pipe("clicks", {}, key="u1", timestamp_ms=stamp)
        state, times = test.table("window-clicks")["u1"], test.table("window-clicks-time")
    view = view_for("window-clicks")
    assert view is not None
    assert view.summarize(state, 0) == {"open_windows": 2, "earliest_start_ms": 0, "records": 3, "closed_windows": 0, "late_records": 0}
    time_view = view_for("window-clicks-time")
    assert time_view is not None
    assert time_view.summarize(times["0"], 0) == {"stream_time_ms": 1_100}
    open_gauge = table_gauge_for("window-clicks")
    time_gauge = table_gauge_for("window-clicks-time")
    assert open_gauge is not None
    assert time_gauge is not None
    assert (open_gauge[0].name, open_gauge[1], open_gauge[0].count(state)) == ("weir_window_open", ("clicks",), 2)
    assert (time_gauge[0].name, time_gauge[1], time_gauge[0].count(times["0"])) == ("weir_window_stream_time_seconds", ("clicks",), 1)
    assert table_gauge_for("window-clicks-closes") is None


def test_sessions_merge_across_a_bridging_record_and_close_a_gap_and_a_grace_after_their_last_record() -> None:
    window = Window("visits", source="views", to="visits", spec=SessionSpec(gap_ms=1_000, grace_ms=1_000), fold=count)
    with driver(window) as test:
        for stamp in (0, 500, 2_000):  # two sessions: [0, 500] and [2000]
            test.pipe("views", {}, key="u1", timestamp_ms=stamp)
        assert test.table("window-visits")["u1"] == {"sessions": [[0, 500, 2, 2], [2_000, 2_000, 1, 1]]}
        test.pipe("views", {}, key="u1", timestamp_ms=1_200)  # within the gap of both (and the grace): they merge
        assert test.table("window-visits")["u1"] == {"sessions": [[0, 2_000, 4, 4]]}
        test.pipe("views", {}, key="u2", timestamp_ms=3_999)  # another key moves stream time: not yet 2000 + 1000 + 1000
        assert finals(test, "visits") == {}
        test.pipe("views", {}, key="u2", timestamp_ms=4_000)
        assert finals(test, "visits") == {("u1", 0): 4}
        [result] = [value for value in test.values("visits") if value["key"] == "u1"]
        assert (result["start_ms"], result["end_ms"], result["count"]) == (0, 2_000, 4)
        test.pipe("views", {}, key="u1", timestamp_ms=1_900)  # its session closed: late
        assert [letter["reason"] for letter in test.dead_letters()] == ["late"]


def test_the_web_views_and_metrics_show_open_sessions_too() -> None:
    from weir.app.metrics import table_gauge_for
    from weir.app.web import view_for

    window = Window("visits", source="views", to="visits", spec=SessionSpec(gap_ms=1_000, grace_ms=1_000), fold=count)
    with driver(window) as test:
        for stamp in (0, 500, 2_000):  # two sessions: [0, 500] and [2000]
            test.pipe("views", {}, key="u1", timestamp_ms=stamp)
        state = test.table("window-visits")["u1"]
    view = view_for("window-visits")
    gauge = table_gauge_for("window-visits")
    assert view is not None
    assert gauge is not None
    assert view.summarize(state, 0) == {"open_windows": 2, "earliest_start_ms": 0, "records": 3, "closed_windows": 0, "late_records": 0}
    assert gauge[0].count(state) == 2


def test_a_retention_keeps_closed_windows_readable_counts_their_late_records_and_then_lets_them_go() -> None:
    from weir.app.web import view_for
    from weir.tables.windows import closed_windows_of

    spec = WindowSpec.hopping(1_000, 500, grace_ms=0, retention_ms=3_000)
    with driver(clicks(spec=spec)) as test:
        for stamp in (100, 600, 1_200):  # windows 0, 500 (both records), 1000 (and 500 again for 1200)
            test.pipe("clicks", {}, key="u1", timestamp_ms=stamp)
        test.pipe("clicks", {}, key="u2", timestamp_ms=1_300)  # stream time 1300: window 0 closed, 500 not yet (1500)
        test.pipe("clicks", {}, key="u1", timestamp_ms=900)  # late for window 0 (closed, kept), in time for 500
        state = test.table("window-clicks")["u1"]
        view = view_for("window-clicks")
        assert view is not None
        summary = view.summarize(state, 0)
        assert (summary["closed_windows"], summary["late_records"]) == (1, 1)
        assert test.dead_letters() == [], "a record late for only some of its windows is no dead letter"
        test.pipe("clicks", {}, key="u2", timestamp_ms=4_100)  # past window 0's end + retention (1000 + 3000)
        kept = [start for start, _, _ in closed_windows_of(test.table("window-clicks")["u1"])]
        assert kept == [500, 1_000], "window 0 went at 1000 + 3000; 500 and 1000 are kept until 4500 and 5000"
        assert finals(test)[("u1", 0)] == 2


def test_a_keys_windows_in_a_time_range_are_its_open_and_kept_closed_windows_as_a_window_store_fetch_gives() -> None:
    """``windows_between`` (Kafka Streams' ``ReadOnlyWindowStore.fetch(key, from, to)``): windows whose start is in the
    range, open ones and those a retention keeps, each with its aggregate; sessions that overlap the range."""
    from weir import windows_between

    spec = WindowSpec.tumbling(1_000, grace_ms=0, retention_ms=10_000)
    with driver(clicks(spec=spec)) as test:
        for stamp in (100, 200, 1_100, 2_100, 2_200, 2_300):
            test.pipe("clicks", {}, key="u1", timestamp_ms=stamp)
        test.pipe("clicks", {}, key="u1", timestamp_ms=300)  # late for the kept window 0
        state = test.table("window-clicks")["u1"]
        every = windows_between(state)
        assert [(w["start_ms"], w["count"], w["closed"], w.get("late")) for w in every] == [
            (0, 2, True, 1),
            (1_000, 1, True, 0),
            (2_000, 3, False, None),
        ]
        assert [w["aggregate"] for w in every] == [2, 1, 3], "each window's count aggregate, as folded"
        assert [w["start_ms"] for w in windows_between(state, 1_000, 1_999)] == [1_000]
        assert [w["start_ms"] for w in windows_between(state, 500)] == [1_000, 2_000]
        assert [w["start_ms"] for w in windows_between(state, None, 999)] == [0]
        assert windows_between(state, 3_000, 4_000) == []

    # a long grace: both sessions still open at stream time 2000
    sessions = Window("visits", source="clicks", to="visits", spec=SessionSpec(gap_ms=500, grace_ms=10_000))  # type: ignore[arg-type]
    with driver(sessions) as test:
        for stamp in (0, 300, 2_000):
            test.pipe("clicks", {}, key="u1", timestamp_ms=stamp)
        state = test.table("window-visits")["u1"]
        assert [(w["start_ms"], w["end_ms"], w["count"]) for w in windows_between(state)] == [(0, 300, 2), (2_000, 2_000, 1)]
        assert [w["start_ms"] for w in windows_between(state, 250, 1_000)] == [0], "a session overlapping the range"
        assert [w["start_ms"] for w in windows_between(state, 301, 1_999)] == []


def test_the_key_view_answers_a_window_tables_time_range_and_refuses_one_elsewhere() -> None:
    from weir.app.web import BadRequest, window_query

    value = {"open": [[2_000, 3, 3]], "closed": [[0, 2, 2, 1]]}
    body = {"table": "window-clicks", "key": "u1", "value": value}
    assert window_query(body, {}) is body, "no range asked: the key's value alone"
    answered = window_query(body, {"from": "1000"})
    assert (answered["from_ms"], answered["to_ms"], [w["start_ms"] for w in answered["windows"]]) == (1_000, None, [2_000])
    with pytest.raises(BadRequest, match="from='soon'"):
        window_query(body, {"from": "soon"})
    with pytest.raises(BadRequest, match="only a window table"):
        window_query({"table": "aggregates", "key": "o-1", "value": {"items": []}}, {"to": "5"})
