"""The split/aggregate pipeline written with Quix Streams, for `python -m bench.compare`.

Run as ``python -m bench.quix_split_aggregate`` with BENCH_APP_ID, BENCH_ORDERS, BENCH_ITEMS, BENCH_AGGREGATES and
BENCH_STATE_DIR set (bench/compare.py sets them). The same work as weir's splitter, items and aggregator,
the way Quix Streams does it, in one process:

    orders (key: order id)
      -> expand each order into its items, sent keyed ``order#index`` to the items topic (Quix does not
         allow a second group_by after one, so this re-keying is an explicit topic, as in weir)
      -> the item step (the demo's pricing) on every item
      -> re-keyed by order id (group_by: repartition topic)
      -> stateful merge by index per order id (RocksDB + changelog); complete when all N arrived
      -> aggregates (key: order id)

``processing_guarantee="exactly-once"`` (Kafka transactions, read_committed), commit interval 0.1 s like
weir's WEIR_COMMIT_INTERVAL default (Quix's own default is 5 s; BENCH_COMMIT_INTERVAL changes it), every other
setting Quix's default (BENCH_POLL_TIMEOUT sets consumer_poll_timeout, default 1 s), 4 partitions everywhere (the repartition
topics copy the source topic's). Not built here (weir has them): deadlines and partial results,
retries and dead letters, expiry of the "done" markers.
"""

from __future__ import annotations

import os
import time
from typing import Any

from quixstreams import Application, State
from quixstreams.models import TopicConfig

from app.catalogue import CATALOGUE_CENTS
from app.settings import default_bootstrap

PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "4"))


def split(order: dict[str, Any]) -> list[dict[str, Any]]:
    items = order["items"]
    total = len(items)
    return [
        {"correlation_id": order["order_id"], "index": index, "total": total, "last": index == total - 1, "payload": payload}
        for index, payload in enumerate(items)
    ]


def price(item: dict[str, Any]) -> dict[str, Any]:
    """The demo's item step (app.demo_items.price_item), reported as an item outcome."""
    payload = item["payload"]
    flavour, scoops = payload.get("flavour"), payload.get("scoops")
    ok = flavour in CATALOGUE_CENTS and isinstance(scoops, int) and scoops > 0
    result = {"flavour": flavour, "scoops": scoops, "price_cents": CATALOGUE_CENTS[flavour] * scoops} if ok else None
    return {
        "kind": "item",
        "correlation_id": item["correlation_id"],
        "index": item["index"],
        "total": item["total"],
        "ok": ok,
        "result": result,
        "error": None if ok else f"item step 'price': invalid item {payload!r}",
    }


def merge(outcome: dict[str, Any], state: State[str, Any]) -> dict[str, Any] | None:
    """Merges an item outcome once by index; returns the merged result when the order is complete."""
    if state.get("done"):
        return None  # a late or redelivered item of a completed order
    received: dict[str, Any] = state.get("items") or {}
    index = str(outcome["index"])
    if index in received:
        return None
    received[index] = {"ok": outcome["ok"], "result": outcome["result"], "error": outcome["error"]}
    total = outcome["total"]
    if len(received) < total:
        state.set("items", received)
        return None
    state.delete("items")
    state.set("done", True)
    items = [
        {"index": number, "status": "ok" if entry["ok"] else "failed", "result": entry["result"], "error": entry["error"]}
        for number, entry in sorted((int(key), entry) for key, entry in received.items())
    ]
    return {
        "correlation_id": outcome["correlation_id"],
        "aggregator": "order-items",
        "status": "complete" if all(entry["ok"] for entry in received.values()) else "failed",
        "expected_count": total,
        "items": items,
        "completed_ms": int(time.time() * 1000),
    }


def build() -> Application:
    app = Application(
        broker_address=default_bootstrap(),
        consumer_group=os.environ.get("BENCH_APP_ID", "bench-quix"),
        processing_guarantee="exactly-once",
        commit_interval=float(os.environ.get("BENCH_COMMIT_INTERVAL", "0.1")),
        auto_offset_reset="earliest",
        consumer_poll_timeout=float(os.environ.get("BENCH_POLL_TIMEOUT", "1.0")),
        state_dir=os.environ.get("BENCH_STATE_DIR", "/tmp/bench-quix-state"),
        loglevel="INFO",
    )
    config = TopicConfig(num_partitions=PARTITIONS, replication_factor=1)
    orders = app.topic(os.environ.get("BENCH_ORDERS", "bench-quix-orders"), key_deserializer="str", config=config)
    aggregates = app.topic(os.environ.get("BENCH_AGGREGATES", "bench-quix-aggregates"), key_serializer="str", config=config)
    # Quix does not nest group_by: the first re-keying (by item) is an explicit topic, as in weir.
    items = app.topic(os.environ.get("BENCH_ITEMS", "bench-quix-items"), key_serializer="str", key_deserializer="str", config=config)
    splitter = app.dataframe(orders).apply(split, expand=True)
    splitter.to_topic(items, key=lambda item: f"{item['correlation_id']}#{item['index']}")
    merged = app.dataframe(items).apply(price).group_by("correlation_id")
    merged = merged.apply(merge, stateful=True).filter(lambda result: result is not None)
    merged.to_topic(aggregates)
    return app


if __name__ == "__main__":
    build().run()
