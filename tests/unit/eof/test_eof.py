"""Unit and property tests for the end-of-stream core in ``tables/eof.py`` and the demo's job (fake clock, no Kafka)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples import eof_orders
from examples.eof_orders import OpeningHours, parse_order, parse_prices
from shop.catalogue import CATALOGUE_CENTS
from weir.tables.eof import (
    CLIENT_STATE_STAGES,
    BatchCounts,
    BatchIds,
    ClientJoin,
    ClientTotals,
    ControllerState,
    Dropped,
    Emit,
    EofConfig,
    EofJob,
    Totals,
    count_runs,
    counts_of_runs,
    filter_batch,
    id_runs,
    ids_of_runs,
    on_aggregator_tick,
    on_batch,
    on_cleanup,
    on_controller_tick,
    on_delivered,
    on_finish,
    on_join_cleanup,
    on_joiner_tick,
    on_report,
    on_sent,
    on_side,
    on_totals,
    reference_report,
)

PROPERTY = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CATALOGUE = {"vanilla": 250, "chocolate": 275, "lemon": 230}
HOURS = OpeningHours("10:00", "22:00")
CONFIG = EofConfig(idle_timeout_ms=60_000, closed_retention_ms=10_000)
#: The demo's job with this file's catalogue (the filter's side of it; the join prices with the client's list).
JOB = EofJob("orders", lambda line: parse_order(line, CATALOGUE, HOURS), eof_orders.zero, eof_orders.merge, eof_orders.join)


def _count_words(totals: dict[str, int], record: str) -> dict[str, int]:
    for word in record.split():
        totals[word] = totals.get(word, 0) + 1
    return totals


def _keep_text(record: object) -> str:
    if not isinstance(record, str) or not record.strip():
        raise Dropped("not a line of text")
    return record.lower()


#: Another job: words counted per client, the report the words said at least ``side`` times (a number; None: 1).
WORDS = EofJob(
    "words",
    select=_keep_text,
    zero=dict,
    merge=_count_words,
    join=lambda client, totals, side: {"words": {word: n for word, n in sorted(totals.items()) if n >= (side or 1)}},
)


def order(order_id: str, *items: tuple[str, int], time: str = "12:00") -> dict[str, object]:
    """An order as the demo's filter forwards it."""
    return {"order_id": order_id, "time": time, "items": [[flavour, scoops] for flavour, scoops in items]}


def order_line(order_id: str, *, time: str = "12:30", flavour: str = "vanilla", scoops: int = 2) -> str:
    return json.dumps({"order_id": order_id, "time": time, "items": [{"flavour": flavour, "scoops": scoops}]})


def test_parse_order_names_each_reason_to_drop() -> None:
    assert parse_order(order_line("o1"), CATALOGUE, HOURS) == order("o1", ("vanilla", 2), time="12:30")
    cases = {
        "{not json": "broken line",
        "[1]": "must be a JSON object",
        order_line("o2", flavour="durian"): "unknown flavour 'durian'",
        order_line("o3", scoops=0): "'scoops' must be a positive integer",
        order_line("o4", scoops=-2): "'scoops' must be a positive integer",
        order_line("o5", time="09:59"): "outside opening hours 10:00-22:00",
        order_line("o6", time="22:00"): "outside opening hours",
        order_line("o7", time="25:00"): "'time' must be 'HH:MM'",
        json.dumps({"order_id": "o8", "time": "12:00", "items": []}): "'items' must be a non-empty list",
    }
    for line, reason in cases.items():
        with pytest.raises(Dropped) as dropped:
            parse_order(line, CATALOGUE, HOURS)
        assert reason in str(dropped.value), (line, dropped.value)
    with pytest.raises(Dropped, match="must be a string"):
        parse_order(["not", "a", "line"], CATALOGUE, HOURS)


def test_filter_forwards_drops_or_splits_with_deterministic_ids() -> None:
    lines = [order_line(f"o{n}") for n in range(5)] + ["broken"]
    kept = filter_batch(7, lines, JOB, max_batch_records=2)
    assert [batch_id for batch_id, _ in kept.forwarded] == ["7.0", "7.1", "7.2"]
    assert [len(orders) for _, orders in kept.forwarded] == [2, 2, 1]
    assert kept.dropped == [(5, kept.dropped[0][1])]
    assert "broken line" in kept.dropped[0][1]
    assert filter_batch(7, lines, JOB, max_batch_records=2) == kept
    assert filter_batch(8, ["broken"], JOB, max_batch_records=2).forwarded == []


def test_a_select_that_fails_otherwise_than_by_value_error_is_the_batch_s_error_not_a_drop() -> None:
    def select(record: object) -> object:
        raise KeyError("a bug in the job")

    with pytest.raises(KeyError):
        filter_batch(0, ["x"], EofJob("bug", select, dict, _count_words, lambda c, t, s: {}), max_batch_records=2)


def test_controller_finishes_once_when_every_batch_is_reported() -> None:
    state = on_sent(None, "c", 3, now_ms=0).state
    for batch, forwarded in [(0, 1), (2, 0)]:
        transition = on_report(state, "c", batch, forwarded, now_ms=1)
        assert transition.emits == []
        state = transition.state
    assert on_report(state, "c", 0, 1, now_ms=2).state == state  # redelivered: not counted twice
    transition = on_report(state, "c", 1, 3, now_ms=3)
    assert transition.emits == [Emit("aggregate", {"kind": "finish", "client": "c", "expected": 4, "batches_sent": 3})]
    state = transition.state
    assert state is not None
    assert on_report(state, "c", 1, 3, now_ms=4).emits == []
    assert on_sent(state, "c", 3, now_ms=4).emits == []


def test_controller_rejects_contradictions() -> None:
    state = on_sent(None, "c", 2, now_ms=0).state
    assert "outside 0..2" in (on_report(state, "c", 2, 1, now_ms=1).rejected or "")
    reported = on_report(state, "c", 0, 1, now_ms=1).state
    assert "now 2" in (on_report(reported, "c", 0, 2, now_ms=2).rejected or "")
    assert "now 5" in (on_sent(reported, "c", 5, now_ms=2).rejected or "")
    early = on_report(None, "d", 4, 1, now_ms=0).state
    assert "batch 4 was reported" in (on_sent(early, "d", 3, now_ms=1).rejected or "")


def test_empty_client_finishes_with_zero_batches_and_gets_an_empty_report() -> None:
    finish = on_sent(None, "c", 0, now_ms=0).emits
    assert finish == [Emit("aggregate", {"kind": "finish", "client": "c", "expected": 0, "batches_sent": 0})]
    flushed = on_finish(None, "c", 0, now_ms=1, job=JOB)
    totals = {"orders": 0, "scoops": {}}
    assert flushed.emits == [Emit("join", {"kind": "totals", "client": "c", "batches": 0, "records": 0, "totals": totals, "error": None})]
    joined = on_totals(on_side(None, "c", CATALOGUE, now_ms=2, job=JOB).state, "c", Totals(0, 0, totals), now_ms=3, job=JOB)
    assert joined.emits[0].value == {
        "client": "c",
        "status": "complete",
        "batches": 0,
        "orders": 0,
        "flavours": {},
        "revenue_cents": 0,
        "unpriced": [],
    }


def test_delivered_cleans_up_and_tombstone_absorbs_late_duplicates_until_retention() -> None:
    state = on_report(on_sent(None, "c", 1, now_ms=0).state, "c", 0, 1, now_ms=0).state
    transition = on_delivered(state, "c", now_ms=100)
    assert transition.emits == [Emit("aggregate", {"kind": "cleanup", "client": "c"}), Emit("join", {"kind": "cleanup", "client": "c"})]
    closed = transition.state
    assert closed is not None
    assert closed == ControllerState("c", 100, closed_ms=100, outcome="complete")  # a tombstone: nothing of the counts
    assert on_report(closed, "c", 0, 1, now_ms=200).state == closed
    assert on_delivered(closed, "c", now_ms=200).emits == []
    assert on_controller_tick(closed, CONFIG, now_ms=100 + CONFIG.closed_retention_ms - 1).state == closed
    assert on_controller_tick(closed, CONFIG, now_ms=100 + CONFIG.closed_retention_ms).state is None


def test_idle_client_is_reported_abandoned_and_cleaned_up() -> None:
    state = on_report(None, "c", 0, 1, now_ms=1_000).state
    assert state is not None
    assert on_controller_tick(state, CONFIG, now_ms=1_000 + CONFIG.idle_timeout_ms - 1).emits == []
    transition = on_controller_tick(state, CONFIG, now_ms=1_000 + CONFIG.idle_timeout_ms)
    assert [emit.to for emit in transition.emits] == ["reports", "aggregate", "join"]
    assert transition.emits[0].value["status"] == "abandoned"
    assert transition.emits[0].value["batches_reported"] == 1
    assert transition.state is not None
    assert transition.state.outcome == "abandoned"


def test_aggregator_groups_by_flavour_counts_batches_by_id_and_rejects_one_too_many() -> None:
    first = order("o", ("lemon", 3), ("mint", 1))
    state = on_batch(None, "c", "0.0", [first, order("p", ("lemon", 2))], now_ms=0, job=JOB).state
    assert on_batch(state, "c", "0.0", [first], now_ms=1, job=JOB).state == state
    flushed = on_finish(state, "c", 1, now_ms=2, job=JOB)
    totals = {"orders": 2, "scoops": {"lemon": 5, "mint": 1}}
    assert flushed.emits == [Emit("join", {"kind": "totals", "client": "c", "batches": 1, "records": 2, "totals": totals, "error": None})]
    assert "then batch '1.0' arrived" in (on_batch(flushed.state, "c", "1.0", [], now_ms=3, job=JOB).rejected or "")
    told = on_finish(None, "d", 1, now_ms=0, job=JOB).state
    assert "now 2" in (on_finish(told, "d", 2, now_ms=1, job=JOB).rejected or "")
    full = on_batch(told, "d", "0.0", [], now_ms=1, job=JOB).state
    assert "is one more" in (on_batch(replace(full, flushed=False), "d", "1.0", [], now_ms=2, job=JOB).rejected or "")


def test_a_merge_does_not_change_the_state_it_was_given() -> None:
    state = on_batch(None, "c", "0.0", [order("o", ("lemon", 3))], now_ms=0, job=JOB).state
    assert state is not None
    before = state.to_dict()
    on_batch(state, "c", "1.0", [order("p", ("lemon", 2))], now_ms=1, job=JOB)
    assert state.to_dict() == before


def test_a_merge_that_raises_still_counts_its_batch_and_the_client_gets_a_failed_report() -> None:
    def merge(totals: dict[str, int], record: str) -> dict[str, int]:
        if record == "boom":
            raise ZeroDivisionError("the job's bug")
        return _count_words(totals, record)

    job = EofJob("fragile", _keep_text, dict, merge, WORDS.join)
    state = on_batch(None, "c", "0.0", ["a b"], now_ms=0, job=job).state
    failed = on_batch(state, "c", "1.0", ["c", "boom"], now_ms=1, job=job).state
    assert failed is not None
    assert (len(failed.seen), failed.records, failed.totals) == (2, 1, {"a": 1, "b": 1}), "the failed batch merged nothing"
    assert failed.error == "merge of batch '1.0' failed: ZeroDivisionError: the job's bug"
    later = on_batch(failed, "c", "2.0", ["d"], now_ms=2, job=job).state  # counted, not merged
    flushed = on_finish(later, "c", 3, now_ms=3, job=job)
    [emit] = flushed.emits
    assert emit.value["error"] == failed.error
    report = on_totals(on_side(None, "c", None, now_ms=4, job=job).state, "c", Totals.from_dict(emit.value), now_ms=5, job=job)
    assert report.emits == [Emit("reports", {"client": "c", "status": "failed", "batches": 3, "error": failed.error})]


def test_a_join_that_raises_or_returns_no_object_gives_a_failed_report() -> None:
    totals = Totals(1, 1, {"orders": 1, "scoops": {"lemon": 1}})
    [bad_side] = on_totals(on_side(None, "c", ["not", "prices"], now_ms=0, job=JOB).state, "c", totals, now_ms=1, job=JOB).emits
    assert bad_side.value["status"] == "failed"
    assert bad_side.value["error"].startswith("join failed: ValueError: the side data of client 'c' must be a price list")
    job = EofJob("odd", _keep_text, dict, _count_words, lambda client, totals, side: ["a list"])
    [odd] = on_totals(on_side(None, "c", None, now_ms=0, job=job).state, "c", Totals(1, 1, {}), now_ms=1, job=job).emits
    error = "join failed: TypeError: join must return a mapping (the report's fields), got list"
    assert odd.value == {"client": "c", "status": "failed", "batches": 1, "error": error}


def test_the_job_s_report_fields_never_replace_the_protocol_s() -> None:
    job = EofJob("liar", _keep_text, dict, _count_words, lambda client, totals, side: {"client": "other", "status": "fine", "n": 1})
    [emit] = on_totals(on_side(None, "c", None, now_ms=0, job=job).state, "c", Totals(2, 1, {}), now_ms=1, job=job).emits
    assert emit.value == {"client": "c", "status": "complete", "batches": 2, "n": 1}


def test_aggregator_cleanup_leaves_a_tombstone_that_expires() -> None:
    state = on_batch(None, "c", "0.0", [], now_ms=0, job=JOB).state
    closed = on_cleanup(state, "c", now_ms=50).state
    assert closed is not None
    assert closed.seen == frozenset()
    assert closed.closed_ms == 50
    assert on_batch(closed, "c", "3.0", [], now_ms=60, job=JOB).state == closed
    assert on_aggregator_tick(closed, CONFIG, now_ms=50 + CONFIG.closed_retention_ms).state is None


def test_joiner_joins_totals_with_the_clients_prices_once_whichever_comes_first() -> None:
    totals = Totals(batches=2, records=3, totals={"orders": 3, "scoops": {"lemon": 3, "durian": 1}})
    prices = {"lemon": 100, "vanilla": 7}
    expected = {
        "client": "c",
        "status": "complete",
        "batches": 2,
        "orders": 3,
        "flavours": {"durian": {"scoops": 1, "revenue_cents": 0}, "lemon": {"scoops": 3, "revenue_cents": 300}},
        "revenue_cents": 300,
        "unpriced": ["durian"],
    }
    first = on_totals(None, "c", totals, now_ms=0, job=JOB)
    assert first.emits == []
    joined = on_side(first.state, "c", prices, now_ms=1, job=JOB)
    assert joined.emits == [Emit("reports", expected)]
    other_way = on_totals(on_side(None, "c", prices, now_ms=0, job=JOB).state, "c", totals, now_ms=1, job=JOB)
    assert other_way.emits == joined.emits
    assert other_way.state == joined.state
    assert on_totals(joined.state, "c", totals, now_ms=2, job=JOB).emits == []  # redelivered: nothing again
    assert on_side(joined.state, "c", prices, now_ms=2, job=JOB).emits == []
    assert "different data" in (on_side(joined.state, "c", {"lemon": 1}, now_ms=2, job=JOB).rejected or "")
    assert "then totals of 9" in (on_totals(joined.state, "c", Totals(9, 3, {}), now_ms=2, job=JOB).rejected or "")


def test_no_side_data_is_side_data_too_the_demo_prices_with_the_catalogue() -> None:
    totals = Totals(1, 1, {"orders": 1, "scoops": {"mint": 2}})
    waiting = on_totals(None, "c", totals, now_ms=0, job=JOB)
    assert waiting.emits == [], "the joiner waits for the gateway's side data, even when it is None"
    [report] = on_side(waiting.state, "c", None, now_ms=1, job=JOB).emits
    assert report.value["revenue_cents"] == 2 * CATALOGUE_CENTS["mint"]


def test_joiner_cleanup_leaves_a_tombstone_that_absorbs_late_messages_and_expires() -> None:
    state = on_side(None, "c", CATALOGUE, now_ms=0, job=JOB).state
    closed = on_join_cleanup(state, "c", now_ms=50).state
    assert closed == ClientJoin("c", 50, closed_ms=50)
    late = Totals(1, 1, {"orders": 1, "scoops": {"lemon": 1}})
    assert on_totals(closed, "c", late, now_ms=60, job=JOB) == on_totals(closed, "c", Totals(1, 1, {}), now_ms=60, job=JOB)
    assert on_totals(closed, "c", late, now_ms=60, job=JOB).state == closed
    assert on_side(closed, "c", CATALOGUE, now_ms=60, job=JOB).state == closed
    assert on_joiner_tick(closed, CONFIG, now_ms=50 + CONFIG.closed_retention_ms - 1).state == closed
    assert on_joiner_tick(closed, CONFIG, now_ms=50 + CONFIG.closed_retention_ms).state is None
    stray = on_side(None, "s", CATALOGUE, now_ms=0, job=JOB).state
    assert stray is not None
    assert on_joiner_tick(stray, CONFIG, now_ms=stray.deadline_ms(CONFIG)).state is None


def test_parse_prices_accepts_only_non_negative_integer_cents() -> None:
    assert parse_prices({"lemon": 0, "mint": 255}) == {"lemon": 0, "mint": 255}
    for bad in [None, [], {"lemon": -1}, {"lemon": 1.5}, {"lemon": True}, {"lemon": "1"}, {"lemon": 2**53}, {1: 5}]:
        assert parse_prices(bad) is None, bad


def test_states_round_trip_through_json() -> None:
    controller = ControllerState("c", 5, sent_total=3, reported={0: 1, 2: 0}, finish_sent=True)
    assert ControllerState.from_dict(json.loads(json.dumps(controller.to_dict()))) == controller
    totals = ClientTotals("c", 5, seen=frozenset({"0.0", "1.1"}), records=3, totals={"scoops": {"mint": 2}}, expected=4, error="x")
    assert ClientTotals.from_dict(json.loads(json.dumps(totals.to_dict()))) == totals
    join = ClientJoin("c", 5, has_side=True, side={"mint": 2}, totals=Totals(2, 3, {"mint": 4}), reported=True)
    assert ClientJoin.from_dict(json.loads(json.dumps(join.to_dict()))) == join
    no_side = ClientJoin("c", 5, has_side=True, side=None, totals=Totals(2, 3, [1, "a"], error="merge failed"))
    assert ClientJoin.from_dict(json.loads(json.dumps(no_side.to_dict()))) == no_side


clients = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=8),  # orders in the batch
        st.floats(min_value=0.0, max_value=1.0),  # drop rate
    ),
    min_size=0,
    max_size=12,
)


prices_lists = st.dictionaries(st.sampled_from(sorted(CATALOGUE)), st.integers(min_value=0, max_value=500), max_size=len(CATALOGUE))


@PROPERTY
@given(
    batches=clients,
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    max_batch_orders=st.integers(min_value=1, max_value=4),
    prices=prices_lists,
)
def test_any_order_and_duplication_gives_the_sequential_report_exactly_once_and_the_cleanup_empties_every_stage(
    batches: list[tuple[int, float]], seed: int, max_batch_orders: int, prices: dict[str, int]
) -> None:
    """The demo's job end to end through every stage (see :func:`_run_protocol`)."""
    rng = random.Random(seed)
    flavours = sorted(CATALOGUE)
    input_batches: list[list[str]] = []
    for number, (size, drop_rate) in enumerate(batches):
        lines = []
        for index in range(size):
            order_id = f"b{number}-{index}"
            if rng.random() < drop_rate:
                lines.append(rng.choice(["broken", order_line(order_id, flavour="durian"), order_line(order_id, time="08:00")]))
            else:
                lines.append(order_line(order_id, flavour=rng.choice(flavours), scoops=rng.randint(1, 4)))
        input_batches.append(lines)
    _run_protocol(JOB, input_batches, prices, rng, max_batch_orders)


@PROPERTY
@given(
    batches=st.lists(st.lists(st.one_of(st.text(alphabet="ab ", max_size=6), st.integers()), max_size=6), max_size=8),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    max_batch_records=st.integers(min_value=1, max_value=3),
    least=st.one_of(st.none(), st.integers(min_value=1, max_value=3)),
)
def test_another_job_gets_the_same_guarantees(batches: list[list[object]], seed: int, max_batch_records: int, least: int | None) -> None:
    """A job of words and numbers (numbers and blank lines dropped) through the same protocol: one exact report."""
    _run_protocol(WORDS, batches, least, random.Random(seed), max_batch_records)


def _run_protocol(job: EofJob, input_batches: list[list[Any]], side: Any, rng: random.Random, max_batch: int) -> None:
    """The protocol end to end through every stage (controller, group-by/aggregate, joiner): shuffled, duplicated
    reports, batches, totals and side data give exactly one report, equal to the reference; then the cleanup
    broadcast, duplicated and mixed with late messages, leaves every stage's key a tombstone, and the retention
    none at all."""
    controller_inbox: list[tuple[str, Any]] = [("sent", len(input_batches))]
    aggregator_inbox: list[tuple[str, Any]] = []
    for batch_id, lines in enumerate(input_batches):
        outcome = filter_batch(batch_id, lines, job, max_batch)
        controller_inbox.append(("report", (batch_id, len(outcome.forwarded))))
        aggregator_inbox.extend(("batch", forwarded) for forwarded in outcome.forwarded)
    controller_inbox += rng.sample(controller_inbox, k=len(controller_inbox) // 2)  # redeliveries
    aggregator_inbox += rng.sample(aggregator_inbox, k=len(aggregator_inbox) // 2)
    rng.shuffle(controller_inbox)

    controller: ControllerState | None = None
    now = 0
    for kind, payload in controller_inbox:
        now += 1
        transition = on_sent(controller, "c", payload, now) if kind == "sent" else on_report(controller, "c", *payload, now)
        assert transition.rejected is None
        controller = transition.state
        aggregator_inbox.extend(("finish", emit.value["expected"]) for emit in transition.emits)
    assert sum(1 for kind, _ in aggregator_inbox if kind == "finish") == 1
    rng.shuffle(aggregator_inbox)

    totals: ClientTotals | None = None
    joiner_inbox: list[tuple[str, Any]] = [("side", side), ("side", side)]  # the gateway's, sent twice
    for kind, payload in aggregator_inbox:
        now += 1
        step = on_finish(totals, "c", payload, now, job) if kind == "finish" else on_batch(totals, "c", *payload, now, job)
        assert step.rejected is None
        totals = step.state
        for emit in step.emits:
            assert emit.to == "join"
            joiner_inbox += [("totals", Totals.from_dict(emit.value))] * rng.randint(1, 2)
    assert sum(1 for kind, _ in joiner_inbox if kind == "totals") >= 1
    rng.shuffle(joiner_inbox)

    join: ClientJoin | None = None
    reports: list[dict[str, Any]] = []
    for kind, payload in joiner_inbox:
        now += 1
        joined = on_side(join, "c", payload, now, job) if kind == "side" else on_totals(join, "c", payload, now, job)
        assert joined.rejected is None
        join = joined.state
        reports.extend(emit.value for emit in joined.emits if emit.to == "reports")

    records = [record for batch in input_batches for record in batch]
    expected = reference_report("c", records, job, side)
    assert len(reports) == 1
    report = dict(reports[0])
    assert report.pop("batches") == len({forwarded[0] for kind, forwarded in aggregator_inbox if kind == "batch"})
    assert report == expected
    assert report["status"] == "complete"

    # The gateway says "delivered" (twice): the controller broadcasts one cleanup per stage with per-client state.
    delivered = on_delivered(controller, "c", now)
    controller = delivered.state
    assert on_delivered(controller, "c", now + 1).emits == []
    cleanups = [emit for emit in delivered.emits if emit.value["kind"] == "cleanup"]
    assert sorted(emit.to for emit in cleanups) == sorted(CLIENT_STATE_STAGES)
    late_for_aggregator = [*[("cleanup", None)] * 2, *rng.sample(aggregator_inbox, k=min(3, len(aggregator_inbox)))]
    late_for_joiner = [*[("cleanup", None)] * 2, *joiner_inbox[:3]]
    rng.shuffle(late_for_aggregator)
    rng.shuffle(late_for_joiner)
    # Late messages may come before the cleanup too; what counts is what is left once the cleanup was applied.
    for kind, payload in late_for_aggregator:
        now += 1
        if kind == "cleanup":
            totals = on_cleanup(totals, "c", now).state
        elif kind == "finish":
            totals = on_finish(totals, "c", payload, now, job).state
        else:
            totals = on_batch(totals, "c", payload[0], payload[1], now, job).state
    for kind, payload in late_for_joiner:
        now += 1
        if kind == "cleanup":
            step_join = on_join_cleanup(join, "c", now)
        elif kind == "side":
            step_join = on_side(join, "c", payload, now, job)
        else:
            step_join = on_totals(join, "c", payload, now, job)
        assert not [emit for emit in step_join.emits if emit.to == "reports"], "a second report"
        join = step_join.state
    assert controller is not None
    assert totals is not None
    assert join is not None
    assert controller.reported == {}
    assert controller.closed_ms is not None
    assert totals.closed_ms is not None
    assert totals == ClientTotals("c", totals.last_activity_ms, closed_ms=totals.closed_ms)  # no batch, no totals left
    assert join.closed_ms is not None
    assert join == ClientJoin("c", join.last_activity_ms, closed_ms=join.closed_ms)  # no side data, no totals left
    later = now + CONFIG.closed_retention_ms + 10
    assert on_controller_tick(controller, CONFIG, later).state is None
    assert on_aggregator_tick(totals, CONFIG, later).state is None
    assert on_joiner_tick(join, CONFIG, later).state is None


@PROPERTY
@given(st.dictionaries(st.integers(min_value=0, max_value=300), st.integers(min_value=0, max_value=3)))
def test_counts_stored_as_runs_come_back_the_same(counts: dict[int, int]) -> None:
    stored = json.loads(json.dumps(count_runs(counts)))
    assert counts_of_runs(stored) == counts
    assert counts_of_runs({str(batch): count for batch, count in counts.items()}) == counts, "the older form"


@PROPERTY
@given(
    st.sets(
        st.one_of(
            st.builds("{}.{}".format, st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=3)),
            st.text(max_size=5),
        )
    )
)
def test_batch_ids_stored_as_runs_come_back_the_same(ids: set[str]) -> None:
    stored = json.loads(json.dumps(id_runs(ids)))
    assert ids_of_runs(stored) == frozenset(ids)
    assert ids_of_runs(sorted(ids)) == frozenset(ids), "the older form"


def test_a_client_s_stored_ids_do_not_grow_with_its_batches_when_they_come_in_order() -> None:
    controller = ControllerState("c", 0, sent_total=5_000, reported=dict.fromkeys(range(5_000), 1))
    totals = ClientTotals("c", 0, seen=frozenset(f"{batch}.0" for batch in range(5_000)))
    assert len(json.dumps(controller.to_dict())) < 300
    assert len(json.dumps(totals.to_dict())) < 300
    assert ControllerState.from_dict(controller.to_dict()) == controller
    assert ClientTotals.from_dict(totals.to_dict()) == totals


def test_a_zero_that_raises_or_totals_and_reports_that_are_not_json_give_failed_reports() -> None:
    def broken_zero() -> dict[str, int]:
        raise RuntimeError("no zero")

    job = EofJob("no zero", _keep_text, broken_zero, _count_words, WORDS.join)
    [flush] = on_finish(None, "c", 0, now_ms=0, job=job).emits
    assert flush.value["error"] == "zero failed: RuntimeError: no zero"
    setty = EofJob("sets", _keep_text, set, lambda totals, record: totals | {record}, lambda c, t, s: {"n": len(t)})
    state = on_batch(None, "c", "0.0", ["a"], now_ms=0, job=setty).state
    assert state is not None
    assert state.error is not None
    assert state.error.startswith("merge of batch '0.0' failed: TypeError")
    odd = EofJob("odd", _keep_text, dict, _count_words, lambda client, totals, side: {"when": {1, 2}})
    [report] = on_totals(on_side(None, "c", None, now_ms=0, job=odd).state, "c", Totals(1, 1, {}), now_ms=1, job=odd).emits
    assert report.value["status"] == "failed"
    assert report.value["error"].startswith("join failed: TypeError")


def test_values_written_before_jobs_were_pluggable_still_read() -> None:
    totals = ClientTotals.from_dict(
        {"client": "c", "last_activity_ms": 5, "seen": ["0.0"], "orders": 3, "scoops": {"mint": 4}, "expected": 1}
    )
    assert (totals.records, totals.totals) == (3, {"orders": 3, "scoops": {"mint": 4}})
    older_totals = {"batches": 1, "orders": 3, "scoops": {"mint": 4}}
    join = ClientJoin.from_dict({"client": "c", "last_activity_ms": 5, "prices": {"mint": 2}, "totals": older_totals, "reported": False})
    assert (join.has_side, join.side) == (True, {"mint": 2})
    assert join.totals == Totals(1, 3, {"orders": 3, "scoops": {"mint": 4}})
    [report] = on_side(replace(join, has_side=False), "c", {"mint": 2}, now_ms=6, job=JOB).emits
    assert report.value["revenue_cents"] == 8


def _stored_one_by_one(ids: set[str]) -> dict[str, Any]:
    """The stored form of a set of ids as it was written before :class:`BatchIds`: parsed id by id, runs per ``k``."""
    by_part: dict[int, list[int]] = {}
    other: list[str] = []
    for batch_id in ids:
        batch, dot, part = batch_id.partition(".")
        if (
            dot
            and batch.isascii()
            and batch.isdigit()
            and str(int(batch)) == batch
            and part.isascii()
            and part.isdigit()
            and str(int(part)) == part
        ):
            by_part.setdefault(int(part), []).append(int(batch))
        else:
            other.append(batch_id)
    stored: dict[str, Any] = {}
    for part, batches in sorted(by_part.items()):
        runs: list[list[int]] = []
        for batch in sorted(set(batches)):
            if runs and runs[-1][1] == batch:
                runs[-1][1] = batch + 1
            else:
                runs.append([batch, batch + 1])
        stored[str(part)] = runs
    if other:
        stored["other"] = sorted(other)
    return stored


_batch_ids = st.lists(
    st.one_of(
        st.builds("{}.{}".format, st.integers(min_value=0, max_value=60), st.integers(min_value=0, max_value=2)),
        st.sampled_from(["01.0", "1.00", "x", "", "3", "2.", ".1", "1.2.3", "٣.0"]),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(_batch_ids)
def test_batch_ids_added_one_at_a_time_are_the_set_of_them_stored_as_before(ids: list[str]) -> None:
    held = BatchIds()
    for number, batch_id in enumerate(ids):
        held = held.with_id(batch_id)
        assert batch_id in held
        assert len(held) == len(set(ids[: number + 1]))
    assert held == frozenset(ids)
    assert held == BatchIds.of(ids)
    assert hash(held) == hash(BatchIds.of(reversed(ids))) == hash(frozenset(ids)), "equal to the frozenset, hashed as it"
    assert sorted(held) == sorted(set(ids))
    assert held.to_raw() == _stored_one_by_one(set(ids)), "the stored form is the one written before"
    assert BatchIds.from_raw(json.loads(json.dumps(held.to_raw()))) == held
    assert all((candidate in held) == (candidate in set(ids)) for candidate in ("0.0", "5.1", "60.2", "61.0", "x", "01.0", "y"))


def test_a_client_merging_batches_in_any_order_keeps_a_few_runs() -> None:
    order = list(range(2_000))
    random.Random(7).shuffle(order)
    held = BatchIds()
    for batch in order:
        held = held.with_id(f"{batch}.0")
    assert held.runs == ((0, ((0, 2_000),)),)
    assert len(held) == 2_000


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(min_value=0, max_value=80), st.integers(min_value=0, max_value=2), max_size=60), st.randoms())
def test_batch_counts_added_one_at_a_time_are_the_dict_of_them_stored_as_before(counts: dict[int, int], rng: Any) -> None:
    order = list(counts)
    rng.shuffle(order)
    held = BatchCounts()
    added: dict[int, int] = {}
    for batch in order:
        held = held.with_count(batch, counts[batch])
        added[batch] = counts[batch]
        assert held.get(batch) == counts[batch]
        assert (len(held), held.total) == (len(added), sum(added.values()))
    assert held == counts
    assert held == BatchCounts.of(counts)
    assert dict(held.items()) == counts
    assert held != {str(batch): count for batch, count in counts.items()} or not counts
    assert held.to_raw() == count_runs(counts), "the stored form is the one written before"
    assert BatchCounts.from_raw(json.loads(json.dumps(held.to_raw()))) == held
    assert BatchCounts.from_raw({str(batch): count for batch, count in counts.items()}) == held, "the older form"
    for probe in (0, 1, 40, 80, 81):
        assert held.get(probe) == counts.get(probe)
        assert held.first_from(probe) == min((batch for batch in counts if batch >= probe), default=None)


@given(st.data())
def test_a_report_desk_assembles_a_filter_answered_client_once_whatever_the_order_and_redeliveries(data: st.DataObject) -> None:
    """Parts (by batch id) and the end in any order, each possibly twice (at_least_once): one report, the same records."""
    from weir.tables.eof import ReportDesk

    parts = [(f"{batch}.{k}", [f"r{batch}-{k}-{n}" for n in range(2)]) for batch in range(4) for k in range(2) if (batch + k) % 3]
    messages = [{"kind": "part", "client": "c", "batch_id": batch_id, "records": records} for batch_id, records in parts]
    messages.append({"kind": "end", "client": "c", "expected": len(parts), "batches_sent": 4})
    messages += data.draw(st.lists(st.sampled_from(messages), max_size=6))  # redelivered
    shuffled = data.draw(st.permutations(messages))
    desk = ReportDesk()
    reports = [found for message in shuffled if (found := desk.take(message)) is not None]
    expected = [record for _, records in parts for record in records]
    assert reports
    assert all(report["records"] == expected for _, report in reports)
    assert reports[0][1]["batches_forwarded"] == len(parts)


def test_a_report_desk_passes_any_joined_report_and_forgets_a_client_s_parts_when_it_is_answered() -> None:
    from weir.tables.eof import ReportDesk

    desk = ReportDesk()
    joined = {"client": "c", "status": "complete", "kind": "a field of the job's join"}
    assert desk.take(joined) == ("c", joined)
    assert desk.take({"kind": "part", "client": "d", "batch_id": "0.0", "records": ["stale"]}) is None
    abandoned = {"client": "d", "status": "abandoned"}
    assert desk.take(abandoned) == ("d", abandoned)
    # the same client name run again: nothing of the earlier run is in its report
    assert desk.take({"kind": "part", "client": "d", "batch_id": "0.0", "records": ["new"]}) is None
    found = desk.take({"kind": "end", "client": "d", "expected": 1, "batches_sent": 1})
    assert found is not None
    assert found[1]["records"] == ["new"]
