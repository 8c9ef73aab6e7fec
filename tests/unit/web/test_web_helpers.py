"""The pure parts of the /weir/ views: escaping, paging, search, summaries, the registry, dead-letter decoding."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from weir.app import web
from weir.app.codec import dumps
from weir.app.errors import dead_letter_record
from weir.app.runtime import views
from weir.tables.aggregates import GroupState, ItemOutcome
from weir.tables.barrier import BarrierState, FlowCompletion, Waiting
from weir.tables.eof import ClientTotals, ControllerState
from weir.tables.triggers import TriggerState

XSS = "<script>alert(1)</script>"
NOW = 1_764_450_000_000


def group(correlation_id: str = "o-17", *, deadline_in_ms: int = 12_000) -> dict[str, Any]:
    return GroupState(
        correlation_id=correlation_id,
        deadline_ms=NOW + deadline_in_ms,
        opened_ms=NOW - 1_000,
        expected_count=4,
        received={0: ItemOutcome(0, True, result=1), 2: ItemOutcome(2, False, error="boom")},
    ).to_dict()


def table_data(keys: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    data = {
        "table": "aggregates",
        "help": "Open split groups",
        "view": "open aggregations",
        "worker": "http://127.0.0.1:6066",
        "now_ms": NOW,
        "q": "",
        "page": 1,
        "size": 50,
        "total": len(keys),
        "groups": {},
        "pages": 1,
        "complete": True,
        "workers": [{"url": "http://127.0.0.1:6066", "partitions": [0, 1], "matched": len(keys), "error": None}],
        "keys": keys,
    }
    data.update(overrides)
    return data


def visible_scripts(page: str) -> list[str]:
    return re.findall(r"<script>(.*?)</script>", page, flags=re.S)


# --------------------------------------------------------------------------------------------- escaping


def test_a_key_with_markup_renders_as_text_in_every_page() -> None:
    summary = web.summarize_value("aggregates", group(XSS), NOW)
    listing = web.render_table(table_data([{"key": XSS, "partition": 1, "worker": "http://127.0.0.1:6066", "summary": summary}], q=XSS))
    key_page = web.render_key(
        {
            "table": "aggregates",
            "key": XSS,
            "partition": 1,
            "worker": "http://127.0.0.1:6066",
            "served_by": "http://127.0.0.1:6067",
            "now_ms": NOW,
            "summary": summary,
            "value": {"payload": XSS},
        }
    )
    error_page = web.render_error(web.error_body("key not found", table="aggregates", key=XSS), 404, now_ms=NOW, worker="w")
    for page in (listing, key_page, error_page):
        assert XSS not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert len(visible_scripts(page)) == 1  # the countdown, and nothing else
        assert "alert" not in visible_scripts(page)[0]
    # in a link the key is percent-encoded, so '/', '<' and '"' cannot end the path or the attribute
    assert 'href="/weir/tables/aggregates/%3Cscript%3Ealert%281%29%3C%2Fscript%3E/"' in listing
    assert 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in listing  # the search box keeps the query as text


def test_attribute_breaking_quotes_are_escaped() -> None:
    assert web.esc('"><img src=x onerror=alert(1)>') == "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"
    assert web.esc("it's") == "it&#x27;s"


def test_dead_letter_page_escapes_the_original_message() -> None:
    record = dead_letter_record(
        reason="undecodable",
        error=f"bad input {XSS}",
        agent="aggregator",
        step="decode",
        attempts=1,
        topic="weir.item-results",
        partition=2,
        offset=9,
        key=XSS.encode(),
        value=f"not json {XSS}".encode(),
        headers=[],
    )
    entry = web.decode_dead_letter(dumps(record), topic="weir.dead-letters", partition=0, offset=3, timestamp_ms=NOW)
    page = web.render_dead_letters({"topic": "weir.dead-letters", "worker": "w", "now_ms": NOW, "limit": 50, "dead_letters": [entry]})
    assert XSS not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 3  # error, key, original message


# ----------------------------------------------------------------------------------------------- paging


def test_paging_defaults_and_limits() -> None:
    assert web.parse_paging({}) == web.Paging(page=1, size=web.DEFAULT_PAGE_SIZE, q="")
    assert web.parse_paging({"page": "3", "size": "20", "q": "o-1"}) == web.Paging(3, 20, "o-1")
    for query in ({"page": "0"}, {"page": "x"}, {"size": "0"}, {"size": str(web.MAX_PAGE_SIZE + 1)}, {"page": "-2"}):
        with pytest.raises(web.BadRequest, match="expected an integer"):
            web.parse_paging(query)
    with pytest.raises(web.BadRequest, match="narrow it with"):
        web.parse_paging({"page": "1000", "size": "500"})
    assert web.parse_paging({"size": "5000"}, max_size=web.MAX_MERGE_DEPTH).size == 5000


def test_pages_cover_every_row_once() -> None:
    rows = list(range(23))
    pages = [web.page_slice(rows, page, 5) for page in range(1, web.page_count(len(rows), 5) + 1)]
    assert [len(page) for page in pages] == [5, 5, 5, 5, 3]
    assert [row for page in pages for row in page] == rows
    assert web.page_slice(rows, 9, 5) == []
    assert web.page_count(0, 5) == 1


def test_search_is_a_case_insensitive_substring_of_the_key() -> None:
    assert web.key_matches("Order-17", "order-1")
    assert web.key_matches(XSS, "SCRIPT")
    assert web.key_matches("anything", "")
    assert not web.key_matches("o-17", "o-18")


def test_weir_partition_hashes_the_raw_key_as_the_producers_do() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    partitioner = DefaultPartitioner()
    for key in ("o-1", "o-2", XSS, "ünïcode"):
        assert web.weir_partition(key, 4) == partitioner(key.encode(), [0, 1, 2, 3], [0, 1, 2, 3])
    # Faust's router hashes the JSON-serialized key instead, which lands elsewhere: why weir locates keys itself.
    assert web.weir_partition("o-1", 4) != partitioner(json.dumps("o-1").encode(), [0, 1, 2, 3], [0, 1, 2, 3])


# --------------------------------------------------------------------------------------- JSON or HTML


def test_json_is_chosen_by_format_or_accept() -> None:
    assert web.wants_json({"format": "json"}, "text/html")
    assert not web.wants_json({"format": "html"}, "application/json")
    assert web.wants_json({}, "application/json")
    assert not web.wants_json({}, "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
    assert not web.wants_json({}, "")


def test_errors_always_have_the_same_fields() -> None:
    assert web.error_body("unknown table", table="x") == {"error": "unknown table", "table": "x", "key": None}


# ------------------------------------------------------------------------------------------- summaries


def test_open_aggregation_summary_and_countdown() -> None:
    summary = web.summarize_value("aggregates", group(), NOW)
    assert summary == {
        "received": 2,
        "expected": 4,
        "missing": [1, 3],
        "failed": [2],
        "opened_ms": NOW - 1_000,
        "updated_ms": None,
        "duplicates": 0,
        "deadline_ms": NOW + 12_000,
        "due_in_s": 12,
    }
    cell = web.render_value("deadline_ms", NOW + 12_000, NOW)
    assert f'data-deadline-ms="{NOW + 12_000}"' in cell
    assert ">due in 12 s<" in cell
    assert web.due_in_text(NOW - 3_400, NOW) == "overdue by 3 s"


def test_barrier_summary_names_what_each_exchange_awaits() -> None:
    waiting = Waiting(
        exchange_id="x-1",
        flow="dispatch",
        arrived_ms=NOW - 5_000,
        deadline_ms=NOW + 60_000,
        awaited=("kitchen", "payment"),
        exchange={"payload": {}},
        resume_step=2,
        satisfied=("kitchen",),
    )
    state = BarrierState(key="o-1", waiting=(waiting,), completions={"kitchen": FlowCompletion("kitchen", "completed", NOW - 1, NOW + 9)})
    summary = web.summarize_value("barrier-await-kitchen-and-payment", state.to_dict(), NOW)
    assert summary["waiting"] == [
        {"exchange_id": "x-1", "flow": "dispatch", "awaiting": ["payment"], "deadline_ms": NOW + 60_000, "due_in_s": 60}
    ]
    assert summary["completions"] == ["kitchen"]
    assert summary["deadline_ms"] == NOW + 60_000
    html = web.render_value("waiting", summary["waiting"], NOW)
    assert "<table>" in html
    assert "payment" in html
    assert "due in 60 s" in html


def test_trigger_and_eof_summaries() -> None:
    trigger = TriggerState(parent_id="p", first_seen_ms=NOW, expected_count=5, registered_ms=NOW, children={"a": "ok", "b": "timeout"})
    assert web.summarize_value("triggers", trigger.to_dict(), NOW) == {
        "registered": True,
        "expected": 5,
        "counted": 2,
        "children_left": 3,
        "not_ok": ["b"],
        "first_seen_ms": NOW,
    }
    controller = ControllerState(client=XSS, last_activity_ms=NOW, sent_total=4, reported={1: 1, 2: 2})
    summary = web.summarize_value("eof_counters", controller.to_dict(), NOW)
    assert (summary["batches_sent"], summary["batches_reported"], summary["batches_forwarded"]) == (4, 2, 3)
    totals = ClientTotals(client="c", last_activity_ms=NOW, seen=frozenset({"1", "2"}), records=7, totals={"n": 7}, expected=3)
    assert web.summarize_value("eof_totals", totals.to_dict(), NOW) == {
        "batches_merged": 2,
        "batches_expected": 3,
        "records": 7,
        "flushed": False,
        "error": None,
        "closed": False,
    }


def test_an_unreadable_value_says_so_instead_of_failing_the_page() -> None:
    summary = web.summarize_value("aggregates", {"not": "a group"}, NOW)
    assert summary["error"].startswith("table 'aggregates': value not readable as open aggregations (KeyError")


def test_tables_without_a_view_get_a_generic_summary() -> None:
    assert web.summarize_value("aggregate_deadlines", 17, NOW) == {"type": "number", "preview": "17"}
    long = web.summarize_value("unknown", {"k": "v" * 200}, NOW)
    assert long["type"] == "object"
    assert long["size"] == 1
    assert len(long["preview"]) == 80


# -------------------------------------------------------------------------------------------- registry


def test_register_view_exact_name_beats_patterns_and_longer_patterns_win() -> None:
    assert web.view_for("aggregates") is not None
    assert web.view_for("barrier-b1").title == "waiting barriers"  # type: ignore[union-attr]
    assert web.view_for("barrier-b1-deadlines").title == "deadline index"  # type: ignore[union-attr]
    assert web.view_for("no-such-table") is None


def test_a_shop_view_is_one_call() -> None:
    def payment_summary(value: Any, now_ms: int) -> dict[str, Any]:
        return {"state": value["state"], "amount_cents": value["amount_cents"]}

    web.register_view("test_payments", summarize=payment_summary, title="payments", group_by=lambda value: value["state"])
    try:
        assert web.summarize_value("test_payments", {"state": "captured", "amount_cents": 500}, NOW) == {
            "state": "captured",
            "amount_cents": 500,
        }
        values = [{"state": "captured"}, {"state": "committed"}, {"state": "captured"}, {"oops": 1}]
        assert web.count_groups("test_payments", values) == {"captured": 2, "committed": 1, "unreadable": 1}
        assert web.merge_counts({"captured": 2}, {"captured": 1, "voided": 4}) == {"captured": 3, "voided": 4}
    finally:
        views._views.pop("test_payments")


def test_dead_letters_decode_the_original_message_where_possible() -> None:
    def record(value: bytes) -> dict[str, Any]:
        raw = dead_letter_record(
            reason="failed",
            error="step 'price' failed",
            agent="items",
            step="price",
            attempts=3,
            topic="weir.items",
            partition=1,
            offset=4,
            key=b"o-1#0",
            value=value,
            headers=[("trace", b"t-1")],
        )
        return web.decode_dead_letter(dumps(raw), topic="weir.dead-letters", partition=1, offset=7, timestamp_ms=NOW)

    as_json = record(b'{"flavour": "vanilla"}')
    assert as_json["value_decoded"] == {"flavour": "vanilla"}
    assert (as_json["reason"], as_json["agent"], as_json["step"], as_json["attempts"], as_json["key"]) == (
        "failed",
        "items",
        "price",
        3,
        "o-1#0",
    )
    assert as_json["origin"] == {"topic": "weir.items", "partition": 1, "offset": 4}
    assert record(b"plain text")["value_decoded"] == "plain text"
    assert record(b"\xff\xfe")["value_decoded"] is None  # binary: only the base64 in "value"
    foreign = web.decode_dead_letter(b"\x00garbage", topic="t", partition=0, offset=0, timestamp_ms=NOW)
    assert foreign["error"].startswith("not a weir dead-letter record")


@pytest.mark.parametrize(
    ("route", "rest", "see", "table", "key"),
    [
        ("router", "", "/weir/", None, None),
        ("router", "topics", "/weir/", None, None),
        ("router", "aggregates/", "/weir/tables/aggregates/", "aggregates", None),
        ("router", "aggregates/o%2F1/", "/weir/tables/aggregates/o%252F1/", "aggregates", "o%2F1"),
        ("router", "aggregates/o-1/", "/weir/tables/aggregates/o-1/", "aggregates", "o-1"),
        ("table", "aggregates/o-1/", "/weir/tables/aggregates/o-1/", "aggregates", "o-1"),
        ("table", "topics/", "/weir/tables/topics/", "topics", None),
    ],
)
def test_faust_routes_answer_a_404_naming_weirs_view(route: str, rest: str, see: str, table: str | None, key: str | None) -> None:
    problem = web.faust_route_refusal(route, rest)
    assert problem.status == 404
    assert problem.body == {"error": problem.body["error"], "table": table, "key": key, "see": see}
    assert problem.body["error"].startswith(f"Faust's /{route}/ views are off on weir workers")
    assert problem.body["error"].endswith(f"see {see}")


@pytest.mark.parametrize(
    "value",
    [
        b'{"order_id": "s-\\udc80", "items": []}',  # a lone surrogate: valid JSON text, no UTF-8 carries it
        b"[" * 300 + b"]" * 300,  # deeper than orjson writes (254 levels)
        b"[" * 100_000 + b"]" * 100_000,  # deeper than Python's json reads
    ],
    ids=["lone-surrogate", "nested-300", "nested-100000"],
)
def test_a_dead_letter_of_any_json_text_renders_as_html_and_as_json(value: bytes) -> None:
    """Each once ended the whole /weir/dead-letters/ page in HTTP 500, so no page past it could be read."""
    from faust.utils import json as faust_json  # what the views' JSON answers are written with

    raw = dead_letter_record(
        reason="invalid",
        error=f"bad order {value[:40]!r}",
        agent="shop_orders",
        step="decode",
        attempts=1,
        topic="shop.orders",
        partition=0,
        offset=1,
        key=b"s-\\udc80",
        value=value,
        headers=[],
    )
    entry = web.decode_dead_letter(dumps(raw), topic="weir.dead-letters", partition=0, offset=1, timestamp_ms=NOW)
    data = web.viewable({"topic": "weir.dead-letters", "worker": "w", "now_ms": NOW, "limit": 50, "dead_letters": [entry]})
    web.render_dead_letters(data).encode()  # aiohttp writes the HTML as UTF-8
    written = faust_json.dumps(data)
    assert json.loads(written)["dead_letters"][0]["offset"] == 1


def test_viewable_keeps_what_every_writer_takes_and_escapes_only_the_rest() -> None:
    assert web.viewable({"a": ["é", 1, None, {"b": "ü"}]}) == {"a": ["é", 1, None, {"b": "ü"}]}
    assert web.viewable("s-\udc80") == "s-\\udc80"
    assert web.viewable({"k\ud800": ("x",)}) == {"k\\ud800": ["x"]}
    deep: Any = "end"
    for _ in range(web.MAX_VIEW_DEPTH + 5):
        deep = [deep]
    shown = web.viewable(deep)
    for _ in range(web.MAX_VIEW_DEPTH):
        shown = shown[0]
    assert isinstance(shown, str)
    assert json.loads(shown) == [[[[["end"]]]]]
