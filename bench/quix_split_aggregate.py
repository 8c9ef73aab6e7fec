"""The split/aggregate pipeline written with Quix Streams, in the forms weir runs, for `python -m bench.compare`.

Run as ``python -m bench.quix_split_aggregate`` with BENCH_APP_ID, BENCH_ORDERS, BENCH_ITEMS, BENCH_AGGREGATES and
BENCH_STATE_DIR set (bench/compare.py sets them, and starts as many such processes, in one consumer group, as
weir has workers for the same work). BENCH_QUIX_FORM picks the form:

``inline`` (against weir's ``WEIR_ITEMS_INLINE=1``): one stage,
    ``dataframe(orders).apply(price every item, build the result).to_topic(aggregates)``.
``chunks`` (against weir's three stages: splitter, items, aggregator; the default):
    orders (key: order id)
      -> split into chunks of BENCH_SPLIT_CHUNK items (default 10, weir's WEIR_SPLIT_CHUNK), each sent keyed
         ``order#first index`` to the items topic (Quix does not nest group_by: this re-keying is an explicit
         topic, as in weir)
      -> price the chunk (the demo's item step on each of its items)
      -> re-keyed by order id (group_by: repartition topic)
      -> stateful merge by index per order id (RocksDB + changelog); complete when all N arrived
      -> aggregates (key: order id)
``per-item``: the same three stages with one record per item (chunks of 1): what this file did before.

Every form's result has the shape of weir's aggregate (``tables.aggregates.merged_result``: status, reason,
expected_count, items with their outcomes, missing, failed), so the harness checks both against the same totals.
The pure functions below are that shape's whole logic; ``build`` only wires them into Quix's dataframe.

``processing_guarantee="exactly-once"`` (Kafka transactions, read_committed), commit interval 0.1 s like
weir's WEIR_COMMIT_INTERVAL default (Quix's own default is 5 s; BENCH_COMMIT_INTERVAL changes it), producer
``linger.ms`` BENCH_PRODUCER_LINGER_MS (compare.py passes weir's WEIR_PRODUCER_LINGER_MS default, 0; librdkafka's
own default is 5), every other setting Quix's default (BENCH_POLL_TIMEOUT sets consumer_poll_timeout, default 1 s),
4 partitions everywhere (the repartition topics copy the source topic's). Not built here (weir has them):
deadlines and partial results, retries and dead letters, expiry of the "done" markers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from examples.pricing import price_item

if TYPE_CHECKING:
    from quixstreams import Application, State

__all__ = ["FORMS", "quix_application", "chunks_of", "merge_outcomes", "price_chunk", "price_order", "result_of", "build"]

#: The values of BENCH_QUIX_FORM.
FORMS = ("inline", "chunks", "per-item")
#: weir's aggregator name in the results (app.pipeline.AGGREGATOR).
AGGREGATOR_NAME = "order-items"
#: The completion reason weir gives a group completed by its item flagged last (tables.aggregates.COMPLETE_BY_FLAG).
REASON_FLAG = "flag"


def outcome_of(index: int, payload: Any, total: int) -> dict[str, Any]:
    """The demo's item step (examples.pricing.price_item) on one item, as an outcome: ok with its result, or failed with the error."""
    outcome: dict[str, Any] = {"index": index, "last": index == total - 1}
    try:
        outcome |= {"ok": True, "result": price_item(payload), "error": None}
    except ValueError as error:
        outcome |= {"ok": False, "result": None, "error": str(error)}
    return outcome


def result_of(correlation_id: str, total: int, outcomes: Iterable[dict[str, Any]], now_ms: int) -> dict[str, Any]:
    """The aggregate of an order whose every outcome is here, in weir's shape (``tables.aggregates.merged_result``)."""
    by_index = sorted(outcomes, key=lambda outcome: outcome["index"])
    items = [
        {"index": outcome["index"], "status": "ok", "result": outcome["result"]}
        if outcome["ok"]
        else {"index": outcome["index"], "status": "failed", "error": outcome["error"]}
        for outcome in by_index
    ]
    return {
        "correlation_id": correlation_id,
        "aggregator": AGGREGATOR_NAME,
        "status": "complete",
        "reason": REASON_FLAG,
        "expected_count": total,
        "items": items,
        "missing": [],
        "failed": [outcome["index"] for outcome in by_index if not outcome["ok"]],
        "completed_ms": now_ms,
    }


def price_order(order: dict[str, Any], now_ms: int | None = None) -> dict[str, Any]:
    """The inline form's one step: every item priced, the order's result built."""
    items = order["items"]
    outcomes = [outcome_of(index, payload, len(items)) for index, payload in enumerate(items)]
    return result_of(order["order_id"], len(items), outcomes, _now_ms() if now_ms is None else now_ms)


def chunks_of(order: dict[str, Any], chunk: int) -> list[dict[str, Any]]:
    """An order's items, ``chunk`` consecutive ones per message, each with its index (``app.aggregation.split_messages``'s chunks)."""
    items = order["items"]
    total, size = len(items), max(1, chunk)
    return [
        {
            "correlation_id": order["order_id"],
            "total": total,
            "items": [{"index": index, "payload": items[index]} for index in range(first, min(first + size, total))],
        }
        for first in range(0, total, size)
    ]


def chunk_key(chunk: dict[str, Any]) -> str:
    """``order#first index``: a chunk's key on the items topic (spreads an order's chunks over the partitions)."""
    return f"{chunk['correlation_id']}#{chunk['items'][0]['index']}"


def price_chunk(chunk: dict[str, Any]) -> dict[str, Any]:
    """The item step on every item of a chunk: the chunk's outcomes, to be merged by order id."""
    total = chunk["total"]
    outcomes = [outcome_of(item["index"], item["payload"], total) for item in chunk["items"]]
    return {"correlation_id": chunk["correlation_id"], "total": total, "outcomes": outcomes}


def merge_outcomes(
    received: dict[str, dict[str, Any]] | None, priced: dict[str, Any], now_ms: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
    """A priced chunk merged into an order's outcomes so far (by index, once each): the outcomes, and the result once all are in."""
    merged = dict(received or {})
    for outcome in priced["outcomes"]:
        merged.setdefault(str(outcome["index"]), outcome)  # a redelivered chunk's outcomes were merged already
    total = priced["total"]
    if len(merged) < total:
        return merged, None
    return merged, result_of(priced["correlation_id"], total, merged.values(), now_ms)


def merge(priced: dict[str, Any], state: State) -> dict[str, Any] | None:
    """The stateful step: merges a priced chunk into the order's state; the result when the order is complete."""
    if state.get("done"):
        return None  # a late or redelivered chunk of a completed order
    merged, result = merge_outcomes(state.get("items"), priced, _now_ms())
    if result is None:
        state.set("items", merged)
        return None
    state.delete("items")
    state.set("done", True)
    return result


def _now_ms() -> int:
    return int(time.time() * 1000)


def form() -> str:
    chosen = os.environ.get("BENCH_QUIX_FORM", "chunks")
    if chosen not in FORMS:
        message = f"bench.quix_split_aggregate: BENCH_QUIX_FORM={chosen!r}, expected one of {list(FORMS)}"
        raise ValueError(message)
    return chosen


def quix_application(group: str, state_dir: str) -> Application:
    """A Quix Streams application as bench.compare runs every Quix side: exactly-once, the commit interval, poll
    timeout and producer linger of BENCH_COMMIT_INTERVAL, BENCH_POLL_TIMEOUT and BENCH_PRODUCER_LINGER_MS, in the
    consumer group BENCH_APP_ID (default ``group``), its state under BENCH_STATE_DIR (default ``state_dir``)."""
    from quixstreams import Application

    from weir.app.settings import default_bootstrap

    return Application(
        broker_address=default_bootstrap(),
        consumer_group=os.environ.get("BENCH_APP_ID", group),
        processing_guarantee="exactly-once",
        commit_interval=float(os.environ.get("BENCH_COMMIT_INTERVAL", "0.1")),
        auto_offset_reset="earliest",
        consumer_poll_timeout=float(os.environ.get("BENCH_POLL_TIMEOUT", "1.0")),
        producer_extra_config={"linger.ms": int(os.environ.get("BENCH_PRODUCER_LINGER_MS", "0"))},
        state_dir=os.environ.get("BENCH_STATE_DIR", state_dir),
        loglevel="INFO",
    )


def build() -> Application:
    from quixstreams.models import TopicConfig

    chosen = form()
    app = quix_application("bench-quix", "/tmp/bench-quix-state")
    partitions = int(os.environ.get("BENCH_PARTITIONS", "4"))
    config = TopicConfig(num_partitions=partitions, replication_factor=1)
    orders = app.topic(os.environ.get("BENCH_ORDERS", "bench-quix-orders"), key_deserializer="str", config=config)
    aggregates = app.topic(os.environ.get("BENCH_AGGREGATES", "bench-quix-aggregates"), key_serializer="str", config=config)
    if chosen == "inline":
        app.dataframe(orders).apply(price_order).to_topic(aggregates)
        return app
    chunk = 1 if chosen == "per-item" else int(os.environ.get("BENCH_SPLIT_CHUNK", "10"))
    items = app.topic(os.environ.get("BENCH_ITEMS", "bench-quix-items"), key_serializer="str", key_deserializer="str", config=config)
    splitter = app.dataframe(orders).apply(lambda order: chunks_of(order, chunk), expand=True)
    splitter.to_topic(items, key=chunk_key)
    merged = app.dataframe(items).apply(price_chunk).group_by("correlation_id")
    merged = merged.apply(merge, stateful=True).filter(lambda result: result is not None)
    merged.to_topic(aggregates)
    return app


if __name__ == "__main__":
    build().run()
