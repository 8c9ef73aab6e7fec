"""Read-only web views of the workers' table state and the dead letters: HTML for people, JSON for tools, from the same data."""

from __future__ import annotations

import asyncio
import html
import json
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import quote, urlencode

import aiohttp
from faust import web
from faust.types import TableT
from yarl import URL

from weir.app import engine, metrics
from weir.app.dead_letter_pages import DeadLetterReader, format_before, parse_before
from weir.app.kafka_io import key_partition
from weir.app.runtime.views import GroupBy, PatternView, Summarize, register_view, view_for
from weir.app.settings import Settings
from weir.tables.aggregates import DoneState, GroupState
from weir.tables.barrier import BarrierState
from weir.tables.eof import ClientJoin, ClientTotals, ControllerState, EofConfig
from weir.tables.triggers import OK, FiredState, TriggerState
from weir.tables.windows import closed_windows_of, open_windows_of, windows_between

__all__ = [
    "register_view",
    "Summarize",
    "PatternView",
    "view_for",
    "summarize_value",
    "Paging",
    "BadRequest",
    "parse_paging",
    "page_slice",
    "key_matches",
    "weir_partition",
    "due_in_text",
    "error_body",
    "faust_route_refusal",
    "wants_json",
    "decode_dead_letter",
    "viewable",
    "install",
    "WebContext",
    "PAGES",
    "render_index",
    "render_table",
    "render_key",
    "render_dead_letters",
    "render_error",
    "GroupBy",
    "count_groups",
    "merge_counts",
    "generic_summary",
]

# Served by each Faust worker's own web server (``WEIR_WEB_HOST``/``WEIR_WEB_PORT``, 127.0.0.1 by default):
#
# - ``/weir/``                          every table of this worker: help text, owned partitions, key counts
# - ``/weir/tables/<name>/``            the whole table's keys (this worker's and its peers'), ``?q=``, ``?page=``, ``?size=``
# - ``/weir/tables/<name>/<key>/``      one key's decoded value and summary, fetched from the worker that owns it;
#                                       a window table's key with ``?from=&to=`` (ms) adds its windows in that range
# - ``/weir/dead-letters/``             ``?limit=`` records of the dead-letter topic, newest first (read_committed);
#                                       ``?before=`` the previous page's ``next`` for the older page
#
# - ``/metrics``                        this worker's Prometheus metrics, in the text format (:mod:`app.metrics`)
# - ``/table/...``, ``/router/...``    Faust's table and router routes, turned off: a JSON 404 whose ``see`` names the view above
#
# Every URL under ``/weir/`` answers JSON with ``?format=json`` or ``Accept: application/json`` (and HTML otherwise). Errors are
# ``{"error": ..., "table": ..., "key": ...}`` with a proper status. Only GET and HEAD are served.
#
# Per-pattern summaries come from a small registry: ``register_view("table-name", summarize=fn)`` where
# ``fn(value, now_ms)`` returns a flat JSON-able mapping (a ``deadline_ms`` field shows as a live countdown).

#: The path prefix of every weir view.
PREFIX = "/weir"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
#: How many keys a worker hands a peer for one page (page x size); deeper pages need a narrower ``q``.
MAX_MERGE_DEPTH = 10_000
DEFAULT_DEAD_LETTERS = 50
MAX_DEAD_LETTERS = 500
PEER_TIMEOUT_S = 5.0


def summarize_value(table_name: str, value: Any, now_ms: int) -> dict[str, Any]:
    """The summary of one value: the registered view's, or a generic one; never raises (a bad value says why)."""
    view = view_for(table_name)
    if view is None:
        return generic_summary(value, now_ms)
    try:
        return dict(view.summarize(value, now_ms))
    except Exception as error:
        return {"error": f"table {table_name!r}: value not readable as {view.title} ({type(error).__name__}: {error})"}


def count_groups(table_name: str, values: Iterable[Any]) -> dict[str, int]:
    """Keys per group of the registered ``group_by`` (empty without one); a value it cannot read counts as "unreadable"."""
    view = view_for(table_name)
    if view is None or view.group_by is None:
        return {}
    counts: dict[str, int] = {}
    for value in values:
        try:
            group = str(view.group_by(value))
        except Exception:
            group = "unreadable"
        counts[group] = counts.get(group, 0) + 1
    return dict(sorted(counts.items()))


def merge_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for mapping in counts:
        for group, count in mapping.items():
            merged[group] = merged.get(group, 0) + int(count)
    return dict(sorted(merged.items()))


def generic_summary(value: Any, now_ms: int) -> dict[str, Any]:
    """What any JSON value looks like at a glance: its type, its size, and the start of its text."""
    text = json.dumps(value, sort_keys=True, default=str)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
    summary: dict[str, Any] = {"type": kind}
    if isinstance(value, dict | list):
        summary["size"] = len(value)
    summary["preview"] = text if len(text) <= 80 else text[:79] + "…"
    return summary


def _due_in_s(deadline_ms: int, now_ms: int) -> int:
    return round((deadline_ms - now_ms) / 1000)


def summarize_open_group(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``aggregates``: an open split group (tables.aggregates.GroupState)."""
    group = GroupState.from_dict(value)
    return {
        "received": len(group.received),
        "expected": group.expected_count,
        "missing": group.missing_indexes(),
        "failed": sorted(index for index, outcome in group.received.items() if not outcome.ok),
        "opened_ms": group.opened_ms,
        "updated_ms": group.updated_ms,
        "duplicates": group.duplicates,
        "deadline_ms": group.deadline_ms,
        "due_in_s": None if group.deadline_ms is None else _due_in_s(group.deadline_ms, now_ms),
    }


def summarize_done_group(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``aggregates_done``: a completed group remembered to count late items (tables.aggregates.DoneState)."""
    done = DoneState.from_dict(value)
    return {"status": done.status, "completed_ms": done.completed_ms, "late_items": len(done.late_indexes), "expires_ms": done.expires_ms}


def summarize_barrier(value: Any, now_ms: int) -> dict[str, Any]:
    """Tables ``barrier-<name>``: exchanges waiting at a barrier, and what each still awaits (tables.barrier.BarrierState)."""
    state = BarrierState.from_dict(value)
    waiting = [
        {
            "exchange_id": entry.exchange_id,
            "flow": entry.flow,
            "awaiting": list(entry.missing),
            "deadline_ms": entry.deadline_ms,
            "due_in_s": _due_in_s(entry.deadline_ms, now_ms),
            # a counted await: how many of the executions it awaits came so far
            **(
                {"counted": {flow: f"{len(entry.received.get(flow, {}))}/{count}" for flow, count in entry.expected.items()}}
                if entry.expected
                else {}
            ),
        }
        for entry in state.waiting
    ]
    summary: dict[str, Any] = {
        "waiting": waiting,
        "completions": sorted({*state.completions, *state.parts}),
        "settled": len(state.settled),
    }
    deadlines = [entry.deadline_ms for entry in state.waiting]
    if deadlines:
        summary["deadline_ms"] = min(deadlines)
        summary["due_in_s"] = _due_in_s(min(deadlines), now_ms)
    return summary


def summarize_trigger(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``triggers``: a counter trigger and the children it still waits for (tables.triggers.TriggerState)."""
    state = TriggerState.from_dict(value)
    return {
        "registered": state.registered,
        "expected": state.expected_count,
        "counted": len(state.children),
        "children_left": state.remaining,
        "not_ok": sorted(child for child, outcome in state.children.items() if outcome != OK),
        "first_seen_ms": state.first_seen_ms,
    }


def summarize_fired_trigger(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``triggers_fired`` (tables.triggers.FiredState)."""
    fired = FiredState.from_dict(value)
    return {
        "fired_by": fired.fired_by,
        "fired_ms": fired.fired_ms,
        "late_completions": fired.late_completions,
        "expires_ms": fired.expires_ms,
    }


def _eof_config() -> EofConfig:
    settings = _context.settings
    return EofConfig(idle_timeout_ms=settings.eof_idle_timeout_ms, closed_retention_ms=settings.eof_closed_retention_ms)


def summarize_eof_controller(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``eof_counters``: one client's batches sent, reported and forwarded (tables.eof.ControllerState)."""
    state = ControllerState.from_dict(value)
    deadline_ms = state.deadline_ms(_eof_config())
    return {
        "batches_sent": state.sent_total,
        "batches_reported": len(state.reported),
        "batches_forwarded": state.forwarded_total,
        "finish_sent": state.finish_sent,
        "outcome": state.outcome,
        "closed": state.closed_ms is not None,
        "deadline_ms": deadline_ms,
        "due_in_s": _due_in_s(deadline_ms, now_ms),
    }


def summarize_eof_totals(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``eof_totals``: one client's batches merged against those expected (tables.eof.ClientTotals)."""
    state = ClientTotals.from_dict(value)
    return {
        "batches_merged": len(state.seen),
        "batches_expected": state.expected,
        "records": state.records,
        "flushed": state.flushed,
        "error": state.error,
        "closed": state.closed_ms is not None,
    }


def summarize_eof_joins(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``eof_joins``: one client's side data and totals, and whether their join went out (tables.eof.ClientJoin)."""
    state = ClientJoin.from_dict(value)
    return {
        "has_side": state.has_side,
        "has_totals": state.totals is not None,
        "batches": None if state.totals is None else state.totals.batches,
        "records": None if state.totals is None else state.totals.records,
        "reported": state.reported,
        "closed": state.closed_ms is not None,
    }


def summarize_window(value: Any, now_ms: int) -> dict[str, Any]:
    """Table ``window-<name>``: one key's open windows (tables.windows.KeyWindows) or sessions (KeySessions)."""
    windows = open_windows_of(value)  # tumbling and hopping windows, or sessions
    closed = closed_windows_of(value)  # kept for the window's retention
    return {
        "open_windows": len(windows),
        "earliest_start_ms": windows[0][0] if windows else None,
        "records": sum(count for _, count in windows),
        "closed_windows": len(closed),
        "late_records": sum(late for _, _, late in closed),
    }


register_view("aggregates", summarize=summarize_open_group, title="open aggregations")
register_view("aggregates_done", summarize=summarize_done_group, title="completed aggregations", group_by=lambda value: value["status"])
register_view("barrier-*", summarize=summarize_barrier, title="waiting barriers")
register_view("barrier-*-deadlines", summarize=generic_summary, title="deadline index")
register_view("window-*", summarize=summarize_window, title="open windows")
register_view("window-*-time", summarize=lambda value, now_ms: {"stream_time_ms": value}, title="stream time per partition")
register_view("window-*-closes", summarize=generic_summary, title="window closes (in stream time)")
register_view(
    "triggers",
    summarize=summarize_trigger,
    title="counter triggers",
    group_by=lambda value: "registered" if value.get("expected_count") is not None else "not registered",
)
register_view("triggers_fired", summarize=summarize_fired_trigger, title="fired triggers")
register_view(
    "eof_counters",
    summarize=summarize_eof_controller,
    title="EOF per client (controller)",
    group_by=lambda value: value.get("outcome") or ("finishing" if value.get("finish_sent") else "open"),
)
register_view("eof_totals", summarize=summarize_eof_totals, title="EOF per client (group-by/aggregate)")
register_view(
    "eof_joins",
    summarize=summarize_eof_joins,
    title="EOF per client (joiner)",
    group_by=lambda value: "closed" if value.get("closed_ms") is not None else ("reported" if value.get("reported") else "joining"),
)

# ---------------------------------------------------------------------------------------- pure helpers


class BadRequest(ValueError):
    """A query parameter out of shape; the text names it and the expected shape."""


@dataclass(frozen=True)
class Paging:
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE
    q: str = ""

    @property
    def depth(self) -> int:
        """How many sorted keys the page needs from each worker."""
        return self.page * self.size


def _positive_int(query: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    raw = query.get(name, "")
    if raw == "":
        return default
    try:
        number = int(raw)
    except ValueError:
        message = f"query parameter {name}={raw!r}: expected an integer from 1 to {maximum}"
        raise BadRequest(message) from None
    if not 1 <= number <= maximum:
        message = f"query parameter {name}={number}: expected an integer from 1 to {maximum}"
        raise BadRequest(message)
    return number


def window_query(body: dict[str, Any], query: Mapping[str, str]) -> dict[str, Any]:
    """A key of a window table asked ``?from=&to=`` (ms, either may be left out): its windows in that range, open and
    kept closed, under ``windows`` (:func:`tables.windows.windows_between`, Kafka Streams' window store ``fetch``)."""
    if "from" not in query and "to" not in query:
        return body
    bounds: list[int | None] = []
    for name in ("from", "to"):
        raw = query.get(name, "")
        try:
            bounds.append(int(raw) if raw != "" else None)
        except ValueError:
            message = f"query parameter {name}={raw!r}: expected a time in ms since the epoch"
            raise BadRequest(message) from None
    value = body.get("value")
    if not str(body.get("table", "")).startswith("window-") or not isinstance(value, dict) or not {"open", "sessions"} & set(value):
        message = "query parameters from and to: only a window table's key (window-<name>) has windows"
        raise BadRequest(message)
    return {**body, "from_ms": bounds[0], "to_ms": bounds[1], "windows": windows_between(value, bounds[0], bounds[1])}


def parse_paging(query: Mapping[str, str], *, max_size: int = MAX_PAGE_SIZE) -> Paging:
    """``?page=`` (from 1), ``?size=`` (1..max_size) and ``?q=`` (a substring of the key) of a list page."""
    paging = Paging(
        page=_positive_int(query, "page", 1, MAX_MERGE_DEPTH),
        size=_positive_int(query, "size", DEFAULT_PAGE_SIZE, max_size),
        q=query.get("q", ""),
    )
    if paging.depth > MAX_MERGE_DEPTH:
        message = (
            f"page {paging.page} of size {paging.size} reaches key {paging.depth}, past the limit of {MAX_MERGE_DEPTH}: narrow it with ?q="
        )
        raise BadRequest(message)
    return paging


def page_slice(rows: Sequence[Any], page: int, size: int) -> list[Any]:
    """Rows of page ``page`` (from 1) of ``size`` rows each."""
    start = (page - 1) * size
    return list(rows[start : start + size])


def page_count(total: int, size: int) -> int:
    return max(1, -(-total // size))


def key_matches(key: str, q: str) -> bool:
    """The search of the list pages: ``q`` is a case-insensitive substring of the key."""
    return q.casefold() in key.casefold()


def weir_partition(key: str, partitions: int) -> int:
    """The partition weir's producers put ``key`` in (Kafka's default partitioner on the raw UTF-8 key).

    Faust's own router hashes the table's *serialized* key (JSON: ``'"o-1"'``), not the raw key the source
    topics are keyed by, so it names the wrong owner for weir's tables; see :meth:`KeyView._from_peers`.
    """
    return key_partition(key.encode(), partitions)


def due_in_text(deadline_ms: int, now_ms: int) -> str:
    left = _due_in_s(deadline_ms, now_ms)
    return f"due in {left} s" if left >= 0 else f"overdue by {-left} s"


def format_ms(ms: int) -> str:
    """An epoch-millisecond instant as UTC ISO-8601 text."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def error_body(error: str, *, table: str | None = None, key: str | None = None) -> dict[str, Any]:
    """The JSON body of every error: the same three fields, always present."""
    return {"error": error, "table": table, "key": key}


def wants_json(query: Mapping[str, str], accept: str) -> bool:
    """``?format=json`` or ``?format=html`` decides; else an Accept that asks for JSON and not HTML."""
    chosen = query.get("format", "")
    if chosen in ("json", "html"):
        return chosen == "json"
    return "application/json" in accept and "text/html" not in accept


def table_path(table: str) -> str:
    return f"{PREFIX}/tables/{quote(table, safe='')}/"


def key_path(table: str, key: str) -> str:
    return f"{table_path(table)}{quote(key, safe='')}/"


def _payload_text(raw: Any) -> str | None:
    """The text of a dead letter's ``{"text": ...}`` / ``{"base64": ...}`` field (None when binary or absent)."""
    if isinstance(raw, dict) and isinstance(raw.get("text"), str):
        return str(raw["text"])
    return None


def decode_dead_letter(raw: bytes | None, *, topic: str, partition: int, offset: int, timestamp_ms: int) -> dict[str, Any]:
    """One record of the dead-letter topic, with the original message decoded where possible.

    ``value_decoded`` is the original value parsed as JSON when it was JSON text, else its text, else None
    (binary: ``value`` keeps the base64).
    """
    entry: dict[str, Any] = {"topic": topic, "partition": partition, "offset": offset, "timestamp_ms": timestamp_ms}
    try:
        record = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack
        record = None
    if not isinstance(record, dict):
        text = raw.decode(errors="replace") if raw is not None else None
        entry.update(reason=None, error=f"not a weir dead-letter record: {text!r:.200}", value=None, value_decoded=None)
        return entry
    for field in ("reason", "error", "agent", "step", "attempts", "origin", "headers", "failed_ms"):
        entry[field] = record.get(field)
    entry["key"] = _payload_text(record.get("key"))
    entry["value"] = record.get("value")
    text = _payload_text(record.get("value"))
    decoded: Any = text
    if text is not None:
        try:
            decoded = json.loads(text)
        except (ValueError, RecursionError):
            decoded = text
    entry["value_decoded"] = decoded
    return entry


#: Deeper structures are shown as their JSON text: orjson, which writes the JSON answers, refuses past 254 levels.
MAX_VIEW_DEPTH = 64


def viewable(value: Any, depth: int = 0) -> Any:
    """``value`` as every view can write it, as JSON and as HTML, whatever a record held.

    A string with a lone surrogate (valid JSON text, ``"\\udc80"``, but no UTF-8 can carry it) keeps it as its escape,
    ``\\udc80``; a list or object nested deeper than :data:`MAX_VIEW_DEPTH` is shown as its JSON text. Either used to
    end the whole page in HTTP 500, so one dead letter could hide every page after it.
    """
    if isinstance(value, str):
        if value.isascii():
            return value
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if isinstance(value, dict | list | tuple) and depth >= MAX_VIEW_DEPTH:
        try:
            return json.dumps(value, ensure_ascii=True, sort_keys=True, default=str)
        except (ValueError, RecursionError):
            return f"(nested deeper than {MAX_VIEW_DEPTH} levels)"
    if isinstance(value, dict):
        return {viewable(key, depth + 1): viewable(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [viewable(item, depth + 1) for item in value]
    return value


# -------------------------------------------------------------------------------------------- HTML


def esc(value: Any) -> str:
    """Every piece of data that reaches HTML goes through here."""
    return html.escape(str(value), quote=True)


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1f3b57;color:#fff;padding:.6em 1.2em}header a{color:#fff;font-weight:600;text-decoration:none}
header .where{opacity:.8;margin-left:1em;font-size:12px}main{padding:1em 1.2em}
table{border-collapse:collapse;background:#fff;margin:.5em 0}
th,td{border:1px solid #d6dbe1;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right}pre{background:#fff;border:1px solid #d6dbe1;padding:.8em;overflow:auto;max-width:100%}
.due{font-weight:600;color:#8a5300}.overdue{font-weight:600;color:#b00020}.muted{color:#6b7785}.warn{color:#b00020}
form input{padding:.2em .4em}nav.pages a{margin-right:1em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dt{font-weight:600}dd{margin:0}
"""

# Counts each deadline down from the server's clock: no data from the tables is in the script.
_COUNTDOWN = """
(function(){var skew=Date.now()-Number(document.body.dataset.nowMs);function tick(){
document.querySelectorAll('[data-deadline-ms]').forEach(function(el){
var left=Math.round((Number(el.dataset.deadlineMs)-(Date.now()-skew))/1000);
el.textContent=left>=0?'due in '+left+' s':'overdue by '+(-left)+' s';el.className=left>=0?'due':'overdue';});}
tick();setInterval(tick,1000);})();
"""


def _page(title: str, body: str, *, now_ms: int, worker: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>weir · {esc(title)}</title><style>{_STYLE}</style></head>"
        f'<body data-now-ms="{int(now_ms)}"><header><a href="{PREFIX}/">weir</a>'
        f'<span class="where">worker {esc(worker)} · {esc(format_ms(now_ms))}</span></header>'
        f"<main>{body}</main><script>{_COUNTDOWN}</script></body></html>"
    )


def _countdown(deadline_ms: int, now_ms: int) -> str:
    css = "due" if deadline_ms >= now_ms else "overdue"
    return (
        f'<span class="{css}" data-deadline-ms="{int(deadline_ms)}" title="{esc(format_ms(deadline_ms))}">'
        f"{esc(due_in_text(deadline_ms, now_ms))}</span>"
    )


def render_value(name: str, value: Any, now_ms: int) -> str:
    """One summary field as HTML: deadlines count down, instants read as dates, lists of records as small tables."""
    if value is None:
        return '<span class="muted">-</span>'
    if name == "deadline_ms" and isinstance(value, int):
        return _countdown(value, now_ms)
    if name.endswith("_ms") and isinstance(value, int) and not isinstance(value, bool):
        return f'<span title="{int(value)}">{esc(format_ms(value))}</span>'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return _records_table(value, now_ms)
    if isinstance(value, list):
        return esc(", ".join(str(item) for item in value)) if value else '<span class="muted">none</span>'
    if isinstance(value, dict):
        return esc(json.dumps(value, sort_keys=True, default=str))
    return esc(value)


def _columns(records: Sequence[Mapping[str, Any]]) -> list[str]:
    columns: list[str] = []
    for record in records:
        for name in record:
            if name not in columns:
                columns.append(name)
    if "deadline_ms" in columns and "due_in_s" in columns:
        columns.remove("due_in_s")  # the countdown says it
    return columns


def _records_table(records: Sequence[Mapping[str, Any]], now_ms: int) -> str:
    columns = _columns(records)
    head = "".join(f"<th>{esc(_label(column))}</th>" for column in columns)
    rows = "".join("<tr>" + "".join(f"<td>{render_value(c, record.get(c), now_ms)}</td>" for c in columns) + "</tr>" for record in records)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _label(field: str) -> str:
    return "deadline" if field == "deadline_ms" else field.removesuffix("_ms").replace("_", " ")


def render_error(body: Mapping[str, Any], status: int, *, now_ms: int, worker: str) -> str:
    parts = [f"<h1>{status}: {esc(body.get('error'))}</h1><dl>"]
    for field in ("table", "key"):
        if body.get(field) is not None:
            parts.append(f"<dt>{field}</dt><dd>{esc(body[field])}</dd>")
    parts.append("</dl>")
    if body.get("see"):
        parts.append(f'<p>see <a href="{esc(body["see"])}">{esc(body["see"])}</a></p>')
    parts.append(f'<p><a href="{PREFIX}/">all tables</a></p>')
    return _page(f"error {status}", "".join(parts), now_ms=now_ms, worker=worker)


def render_index(data: Mapping[str, Any]) -> str:
    """The ``/weir/`` page from its JSON data."""
    now_ms = int(data["now_ms"])
    rows = []
    for table in data["tables"]:
        partitions = ", ".join(str(p) for p in table["partitions"]) or '<span class="muted">none</span>'
        rows.append(
            f'<tr><td><a href="{esc(table_path(table["name"]))}">{esc(table["name"])}</a></td>'
            f"<td>{esc(table['view'] or '')}</td><td class=num>{int(table['keys'])}</td><td>{partitions}</td>"
            f"<td>{esc(table['help'])}</td></tr>"
        )
    workers = "".join(
        f'<li><a href="{esc(url)}{PREFIX}/">{esc(url)}</a>{" (this one)" if url == data["worker"] else ""}</li>' for url in data["workers"]
    )
    body = (
        f"<h1>Tables of group {esc(data['group'])}</h1>"
        "<table><thead><tr><th>table</th><th>view</th><th>keys here</th><th>partitions here</th><th>what it holds</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<h2>Workers of this group</h2><ul>{workers}</ul>"
        f'<p><a href="{PREFIX}/dead-letters/">dead letters</a> (last records of {esc(data["dead_letters_topic"])})</p>'
    )
    return _page("tables", body, now_ms=now_ms, worker=str(data["worker"]))


def render_table(data: Mapping[str, Any]) -> str:
    """The ``/weir/tables/<name>/`` page from its JSON data."""
    now_ms = int(data["now_ms"])
    name = str(data["table"])
    records = [
        {"key": row["key"], **row["summary"], "partition": row["partition"], "worker": row["worker"]}
        for row in data["keys"]
        if "summary" in row
    ]
    columns = _columns(records)
    head = "".join(f"<th>{esc(_label(column))}</th>" for column in columns)
    rows = []
    for record in records:
        cells = []
        for column in columns:
            if column == "key":
                cells.append(f'<td><a href="{esc(key_path(name, record["key"]))}">{esc(record["key"])}</a></td>')
            else:
                cells.append(f"<td>{render_value(column, record.get(column), now_ms)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    unreachable = [worker for worker in data["workers"] if worker.get("error")]
    notice = "".join(f'<p class="warn">worker {esc(w["url"])} did not answer: {esc(w["error"])}</p>' for w in unreachable)
    nav = []
    query = {"q": data["q"], "size": data["size"]}
    if data["page"] > 1:
        nav.append(f'<a href="?{esc(urlencode({**query, "page": data["page"] - 1}))}">previous</a>')
    if data["page"] < data["pages"]:
        nav.append(f'<a href="?{esc(urlencode({**query, "page": data["page"] + 1}))}">next</a>')
    body = (
        f"<h1>{esc(name)}</h1><p>{esc(data['help'])}</p>"
        f'<form method="get"><input name="q" value="{esc(data["q"])}" placeholder="key contains">'
        f'<input type="hidden" name="size" value="{int(data["size"])}"><button>search</button></form>'
        f"<p>{int(data['total'])} keys{' matching ' + esc(repr(data['q'])) if data['q'] else ''} on "
        f"{len(data['workers'])} worker(s) · page {int(data['page'])} of {int(data['pages'])}</p>{notice}"
        + _groups_table(data["groups"])
        + (f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>" if rows else '<p class="muted">no keys</p>')
        + f'<nav class="pages">{"".join(nav)}</nav>'
    )
    return _page(name, body, now_ms=now_ms, worker=str(data["worker"]))


def _groups_table(groups: Mapping[str, int]) -> str:
    if not groups:
        return ""
    rows = "".join(f"<tr><td>{esc(group)}</td><td class=num>{int(count)}</td></tr>" for group, count in groups.items())
    return f'<table class="groups"><thead><tr><th>group</th><th>keys</th></tr></thead><tbody>{rows}</tbody></table>'


def render_key(data: Mapping[str, Any]) -> str:
    """The ``/weir/tables/<name>/<key>/`` page from its JSON data."""
    now_ms = int(data["now_ms"])
    summary = "".join(
        f"<dt>{esc(_label(k))}</dt><dd>{render_value(k, v, now_ms)}</dd>" for k, v in data["summary"].items() if k != "due_in_s"
    )
    pretty = json.dumps(data["value"], indent=2, sort_keys=True, ensure_ascii=False, default=str)
    body = (
        f'<p><a href="{esc(table_path(data["table"]))}">{esc(data["table"])}</a></p>'
        f"<h1>{esc(data['key'])}</h1>"
        f"<p class=muted>partition {esc(data['partition'])} · owned by {esc(data['worker'])}</p>"
        f"<dl>{summary}</dl><h2>value</h2><pre>{esc(pretty)}</pre>"
    )
    return _page(f"{data['table']} / {data['key']}", body, now_ms=now_ms, worker=str(data["served_by"]))


def render_dead_letters(data: Mapping[str, Any]) -> str:
    """The ``/weir/dead-letters/`` page from its JSON data."""
    now_ms = int(data["now_ms"])
    rows = []
    for entry in data["dead_letters"]:
        origin = entry.get("origin") or {}
        where = f"{origin.get('topic')}[{origin.get('partition')}]@{origin.get('offset')}" if origin else ""
        decoded = entry.get("value_decoded")
        original = decoded if isinstance(decoded, str) else json.dumps(decoded, indent=1, sort_keys=True, ensure_ascii=False)
        failed = entry.get("failed_ms")
        rows.append(
            "<tr>"
            f"<td>{render_value('failed_ms', failed, now_ms) if isinstance(failed, int) else ''}</td>"
            f"<td>{esc(entry.get('reason'))}</td><td>{esc(entry.get('agent'))} / {esc(entry.get('step'))}</td>"
            f"<td class=num>{esc(entry.get('attempts'))}</td><td>{esc(entry.get('error'))}</td><td>{esc(where)}</td>"
            f"<td>{esc(entry.get('key'))}</td><td><pre>{esc(original)}</pre></td></tr>"
        )
    nav = [f'<a href="?{esc(urlencode({"limit": data["limit"]}))}">newest</a>'] if data.get("before") else []
    if data.get("next"):
        nav.append(f'<a href="?{esc(urlencode({"limit": data["limit"], "before": data["next"]}))}">older</a>')
    which = "older records" if data.get("before") else "the newest records"
    body = (
        f"<h1>Dead letters</h1><p>{len(data['dead_letters'])} of {which} of {esc(data['topic'])} (newest first, committed only).</p>"
        "<table><thead><tr><th>failed</th><th>reason</th><th>agent / step</th><th>attempts</th><th>error</th><th>origin</th>"
        f"<th>key</th><th>original message</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f'<nav class="pages">{"".join(nav)}</nav>'
    )
    return _page("dead letters", body, now_ms=now_ms, worker=str(data["worker"]))


# ----------------------------------------------------------------------------------------- the views


class Problem(Exception):
    """An answer that is an error: its status and its JSON body."""

    def __init__(self, status: int, error: str, *, table: str | None = None, key: str | None = None, see: str | None = None) -> None:
        super().__init__(error)
        self.status = status
        self.body = error_body(error, table=table, key=key)
        if see is not None:
            self.body["see"] = see  # the weir view that answers instead


def _now_ms() -> int:
    return int(time.time() * 1000)


def _same_url(left: str, right: str) -> bool:
    a, b = URL(left), URL(right)
    return (a.host, a.port) == (b.host, b.port)


class WeirView(web.View):
    """The base of every weir view: GET only, JSON or HTML from the same data, structured errors."""

    async def get(self, request: web.Request, **match: str) -> web.Response:
        as_json = wants_json(request.query, request.headers.get("Accept", ""))
        try:
            data = await self.data(request, **match)
        except Problem as problem:
            if as_json:
                return self.json(problem.body, status=problem.status)
            return self.html(render_error(problem.body, problem.status, now_ms=_now_ms(), worker=self.worker_url), status=problem.status)
        except BadRequest as error:
            body = error_body(str(error), table=match.get("name"), key=match.get("key"))
            if as_json:
                return self.json(body, status=400)
            return self.html(render_error(body, 400, now_ms=_now_ms(), worker=self.worker_url), status=400)
        data = viewable(data)
        return self.json(data) if as_json else self.html(self.render(data))

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        raise NotImplementedError

    def render(self, data: Mapping[str, Any]) -> str:
        raise NotImplementedError

    async def _refuse(self, request: web.Request, **match: str) -> web.Response:
        message = f"method {request.method} not allowed: the weir views only read (GET, HEAD)"
        body = error_body(message, table=match.get("name"), key=match.get("key"))
        return self.json(body, status=405, headers={"Allow": "GET, HEAD"})

    post = put = patch = delete = options = search = _refuse

    # ------------------------------------------------------------------ table helpers (faust's tables app)

    @property
    def worker_url(self) -> str:
        return str(self.app.conf.canonical_url)

    def get_table_or_404(self, name: str) -> TableT[Any, Any]:
        try:
            return cast(TableT[Any, Any], self.app.tables[name])
        except KeyError:
            raise Problem(404, f"no table {name!r} on this worker", table=name) from None

    def changelog_topic(self, table: TableT[Any, Any]) -> str:
        return table.changelog_topic.get_topic_name()

    def local_partitions(self, table: TableT[Any, Any]) -> list[int]:
        topic = self.changelog_topic(table)
        return sorted(tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == topic)

    def local_items(self, table: TableT[Any, Any]) -> Iterator[tuple[int | None, str, Any]]:
        """(partition, key, value) of the partitions this worker owns."""
        if not engine.by_partition(table):  # not RocksDB: partitions unknown
            for key, value in table.items():
                yield None, str(key), value
            return
        for partition in self.local_partitions(table):
            for key, value in engine.partition_items(table, partition):
                yield partition, str(key), value

    def peers(self, table: TableT[Any, Any]) -> dict[str, list[int]]:
        """The other workers of this group that own partitions of ``table``, with those partitions."""
        topic = self.changelog_topic(table)
        try:
            metadata = self.app.router.table_metadata(table.name)
        except KeyError:
            return {}
        return {
            str(url): sorted(topics_.get(topic, ()))
            for url, topics_ in metadata.items()
            if not _same_url(str(url), self.worker_url) and topics_.get(topic)
        }

    async def fetch_peer(self, url: str, path: str, params: Mapping[str, str]) -> tuple[int, Any]:
        target = str(URL(url).with_path(path, encoded=True).with_query(dict(params)))
        timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)
        async with self.app.http_client.get(target, timeout=timeout, headers={"Accept": "application/json"}) as response:
            return response.status, await response.json(content_type=None)


class IndexView(WeirView):
    """Every table of this worker with its help text, owned partitions and key count."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        tables = []
        workers = {self.worker_url}
        for name, table in sorted(self.app.tables.items()):
            view = view_for(name)
            tables.append(
                {
                    "name": name,
                    "help": table.help,
                    "view": view.title if view is not None else None,
                    "keys": sum(1 for _ in self.local_items(table)),
                    "partitions": self.local_partitions(table),
                }
            )
            workers.update(self.peers(table))
        return {
            "worker": self.worker_url,
            "group": self.app.conf.id,
            "now_ms": _now_ms(),
            "tables": tables,
            "workers": sorted(workers),
            "dead_letters_topic": _context.dead_letters_topic,
        }

    def render(self, data: Mapping[str, Any]) -> str:
        return render_index(data)


class TableView(WeirView):
    """A page of the whole table's keys (sorted, searched), merged from every worker that owns a part of it."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        name = match["name"]
        table = self.get_table_or_404(name)
        local_only = request.query.get("local") == "1"
        paging = parse_paging(request.query, max_size=MAX_MERGE_DEPTH if local_only else MAX_PAGE_SIZE)
        now_ms = _now_ms()
        matched = sorted(
            ((key, partition, value) for partition, key, value in self.local_items(table) if key_matches(key, paging.q)),
            key=lambda row: row[0],
        )
        rows = [
            {"key": key, "partition": partition, "worker": self.worker_url, "summary": summarize_value(name, value, now_ms)}
            for key, partition, value in matched[: paging.depth]
        ]
        groups = [count_groups(name, (value for _, _, value in matched))]
        workers: list[dict[str, Any]] = [
            {"url": self.worker_url, "partitions": self.local_partitions(table), "matched": len(matched), "error": None}
        ]
        if not local_only:
            peers = self.peers(table)
            params = {"format": "json", "local": "1", "q": paging.q, "page": "1", "size": str(paging.depth)}
            answers = await asyncio.gather(
                *(self.fetch_peer(url, table_path(name), params) for url in peers),
                return_exceptions=True,
            )
            for (url, partitions), answer in zip(peers.items(), answers, strict=True):
                if isinstance(answer, BaseException) or answer[0] != 200:
                    error = f"{type(answer).__name__}: {answer}" if isinstance(answer, BaseException) else f"HTTP {answer[0]}: {answer[1]}"
                    workers.append({"url": url, "partitions": partitions, "matched": None, "error": error})
                    continue
                body = answer[1]
                workers.append({"url": url, "partitions": partitions, "matched": body["total"], "error": None})
                rows.extend(body["keys"])
                groups.append(body["groups"])
        rows.sort(key=lambda row: str(row["key"]))
        total = sum(worker["matched"] or 0 for worker in workers)
        view = view_for(name)
        return {
            "table": name,
            "help": table.help,
            "view": view.title if view is not None else None,
            "worker": self.worker_url,
            "now_ms": now_ms,
            "q": paging.q,
            "page": paging.page,
            "size": paging.size,
            "total": total,
            "groups": merge_counts(*groups),
            "pages": page_count(total, paging.size),
            "complete": all(worker["error"] is None for worker in workers),
            "workers": workers,
            "keys": page_slice(rows, paging.page, paging.size),
        }

    def render(self, data: Mapping[str, Any]) -> str:
        return render_table(data)


class KeyView(WeirView):
    """One key's decoded value: from this worker when it owns the key, else fetched from the worker that does."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        return window_query(await self._lookup(request, match["name"], match["key"]), request.query)

    async def _lookup(self, request: web.Request, name: str, key: str) -> dict[str, Any]:
        table = self.get_table_or_404(name)
        for partition, local_key, value in self._local_lookup(table, key):
            return {
                "table": name,
                "key": local_key,
                "partition": partition,
                "worker": self.worker_url,
                "served_by": self.worker_url,
                "now_ms": _now_ms(),
                "summary": summarize_value(name, value, _now_ms()),
                "value": value,
            }
        if request.query.get("local") == "1":
            raise Problem(404, "key not found", table=name, key=key)
        return await self._from_peers(table, key)

    def _local_lookup(self, table: TableT[Any, Any], key: str) -> Iterator[tuple[int | None, str, Any]]:
        if not engine.by_partition(table):
            value = table.get(key)
            if value is not None:
                yield None, key, value
            return
        found = engine.partition_get(table, key, self.local_partitions(table))
        if found is not None:
            yield found[0], key, found[1]

    async def _from_peers(self, table: TableT[Any, Any], key: str) -> dict[str, Any]:
        # The owner of the key's partition first (how weir's topics are keyed), then the others: tables such
        # as deadline indexes are keyed by partition, not by a hash of the key.
        peers = self.peers(table)
        partition = weir_partition(key, table.partitions or _context.settings.partitions)
        ordered = sorted(peers, key=lambda url: partition not in peers[url])
        failures = []
        for url in ordered:
            try:
                status, body = await self.fetch_peer(url, key_path(table.name, key), {"format": "json", "local": "1"})
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                failures.append(f"{url}: {type(error).__name__} {error}")
                continue
            if status == 200:
                body["served_by"] = self.worker_url
                return dict(body)
            if status != 404:
                failures.append(f"{url}: HTTP {status}")
        if failures:
            raise Problem(
                503, f"key not found on the workers that answered; no answer from {'; '.join(failures)}", table=table.name, key=key
            )
        raise Problem(404, "key not found", table=table.name, key=key)

    def render(self, data: Mapping[str, Any]) -> str:
        return render_key(data)


class DeadLettersView(WeirView):
    """A page of the dead-letter topic, newest first, read_committed; ``?before=`` (the previous page's ``next``) pages back."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        limit = _positive_int(request.query, "limit", DEFAULT_DEAD_LETTERS, MAX_DEAD_LETTERS)
        topic = _context.dead_letters_topic
        partitions = _context.topic_partitions.get(topic, _context.settings.partitions)
        try:
            before = parse_before(request.query.get("before", ""), partitions)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        try:
            page = await _context.dead_letter_reader.page(topic, partitions, before, limit)
        except Exception as error:
            raise Problem(503, f"could not read {topic} from {_context.settings.bootstrap}: {type(error).__name__} {error}") from None
        return {
            "topic": topic,
            "worker": self.worker_url,
            "now_ms": _now_ms(),
            "limit": limit,
            "before": format_before(before) if before else None,
            "next": None if page.next_before is None else format_before(page.next_before),
            "reader": {"consumers_started": _context.dead_letter_reader.started, "pages_read": _context.dead_letter_reader.pages},
            "dead_letters": page.entries,
        }

    def render(self, data: Mapping[str, Any]) -> str:
        return render_dead_letters(data)


class MetricsView(web.View):
    """This worker's metrics in Prometheus' text format: counters of the shared layers, lag and table keys read now."""

    async def get(self, request: web.Request) -> web.Response:
        return self.bytes(metrics.exposition(), headers={"Content-Type": metrics.CONTENT_TYPE})


# Faust's own ``/table/`` and ``/router/`` routes are off (``web_tables_enabled=False``, ``web_router_enabled=False`` in
# app.core): their key routes find the worker that owns the partition of the table's *serialized* key (JSON, ``'"o-1"'``),
# hashed by Faust's partitioner, while weir's tables are partitioned like their source topics, by the raw key; so
# ``/table/<t>/<k>/`` asked the wrong worker, which answered 404 for keys that exist, and ``/router/<t>/<k>/`` named the
# wrong worker's URL. Tables keyed by partition (the deadline indexes) have no owner by key at all. Routing Faust's
# views by weir's partitioner would be a second, weaker copy of ``KeyView`` (whose answer names the worker that owns the
# key, ``worker``); their paths answer a JSON 404 that names weir's view of the same table or key instead.


def faust_route_refusal(route: str, rest: str) -> Problem:
    """The answer to Faust's ``/<route>/<rest>`` (``table`` or ``router``): a 404 whose ``see`` names weir's view of the same."""
    name, _, key = rest.removesuffix("/").partition("/")
    if route == "router" and name == "topics" and not key:
        name = ""  # /router/topics: the routes of external topics, which weir's index lists with the workers
    see = key_path(name, key) if key else table_path(name) if name else f"{PREFIX}/"
    message = f"Faust's /{route}/ views are off on weir workers (they route keys by Faust's partitioner, not weir's): see {see}"
    return Problem(404, message, table=name or None, key=key or None, see=see)


class FaustTablesView(WeirView):
    """Faust's ``/table/``, ``/table/<table>/``, ``/table/<table>/<key>/``: a 404 naming weir's view of the same."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        raise faust_route_refusal("table", match["rest"])

    def render(self, data: Mapping[str, Any]) -> str:
        raise NotImplementedError  # data() always raises


class FaustRouterView(WeirView):
    """Faust's ``/router/``, ``/router/topics``, ``/router/<table>/``, ``/router/<table>/<key>/``: a 404 naming weir's view."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        raise faust_route_refusal("router", match["rest"])

    def render(self, data: Mapping[str, Any]) -> str:
        raise NotImplementedError  # data() always raises


class UnknownView(WeirView):
    """Any other path under the views' prefix: the same structured 404 as every other error (registered last)."""

    async def data(self, request: web.Request, **match: str) -> dict[str, Any]:
        raise Problem(404, f"no view at {request.rel_url.path}: the index is {PREFIX}/")

    def render(self, data: Mapping[str, Any]) -> str:
        raise NotImplementedError  # data() always raises


@dataclass
class WebContext:
    """What the views read besides the Faust app: the settings, the dead-letter topic, the topics' partition counts."""

    settings: Settings
    dead_letters_topic: str
    topic_partitions: Mapping[str, int]
    #: the worker's one reader of the dead-letter topic, started by the first request (see :class:`DeadLetterReader`)
    dead_letter_reader: DeadLetterReader


#: The views' context: the worker's, once :func:`install` ran (one application per process); the defaults before.
_context = WebContext(Settings(), "dead-letters", {}, DeadLetterReader("", {}, decode_dead_letter))

#: Every page: its path, its name, its view (the catch-all under the prefix last).
PAGES: tuple[tuple[str, str, type[web.View]], ...] = (
    (f"{PREFIX}/", "weir-index", IndexView),
    (PREFIX + "/tables/{name}/", "weir-table", TableView),
    (PREFIX + "/tables/{name}/{key:.+}/", "weir-key", KeyView),
    (f"{PREFIX}/dead-letters/", "weir-dead-letters", DeadLettersView),
    ("/metrics", "weir-metrics", MetricsView),
    ("/table/{rest:.*}", "weir-faust-tables", FaustTablesView),
    ("/router/{rest:.*}", "weir-faust-router", FaustRouterView),
    (PREFIX + "/{rest:.*}", "weir-unknown", UnknownView),
)


def install(app: Any, *, settings: Settings, topics: Any, topic_partitions: Mapping[str, int]) -> None:
    """Serve the views on the worker's Faust ``app``: its tables, the dead letters of ``topics``, its metrics."""
    global _context
    _context = WebContext(
        settings=settings,
        dead_letters_topic=topics.dead_letters.get_topic_name(),
        topic_partitions=topic_partitions,
        dead_letter_reader=DeadLetterReader(settings.bootstrap, settings.kafka_client_options(), decode_dead_letter),
    )
    reader = _context.dead_letter_reader

    async def stop_dead_letter_reader(sender: Any, /, *_: Any, signal: Any = None, **__: Any) -> None:
        await reader.stop()

    app.on_before_shutdown.connect(stop_dead_letter_reader, weak=False)
    for path, name, view in PAGES:
        app.page(path, name=name)(view)
