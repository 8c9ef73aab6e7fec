"""The flows the split/aggregate flow tests run in real workers (WEIR_FLOWS=tests.integration.split_flows)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weir.app.flows import Exchange, Flow, header, payload

TIMEOUT_MS = int(os.environ.get("TEST_AGGREGATE_TIMEOUT_MS", "30000"))
PRICES = {"vanilla": 250, "chocolate": 300, "mint": 275}


#: Told of each step's execution, as a line ("stamp o-1", "price o-1#0"): the tests count how often steps ran.
Record = Callable[[str], None]


def log_to_file(line: str) -> None:
    """Appends one line per step execution to TEST_STEP_LOG (a worker's steps, counted by the broker tests)."""
    path = os.environ.get("TEST_STEP_LOG")
    if path:
        with Path(path).open("a") as log:
            log.write(line + "\n")


def make_flows(*, timeout_ms: int = 30_000, record: Record = log_to_file) -> list[Flow]:
    """The orders flow (stamp, split, price and tax per item, aggregate, total) and the audit flow awaiting it."""

    def stamp(exchange: Exchange) -> None:
        """Before the split: a header the audit barrier reads, and a property the step after the aggregate reads."""
        exchange.headers["order-id"] = str(exchange.payload["order_id"])
        exchange.properties["screen"] = exchange.payload.get("screen", "s1")
        record(f"stamp {exchange.payload['order_id']}")

    def price(exchange: Exchange) -> dict[str, Any]:
        """Per item: its price; an unknown flavour fails (every retry)."""
        item = exchange.payload
        record(f"price {exchange.key}#{exchange.properties['split_index']}")
        if item["flavour"] not in PRICES:
            raise ValueError(f"no price for flavour {item['flavour']!r}")
        return {**item, "cents": PRICES[item["flavour"]] * item["scoops"], "order_header": exchange.headers.get("order-id")}

    def tax(exchange: Exchange) -> dict[str, Any]:
        """Per item, after price: the process steps of a segment run in order on the item."""
        return {**exchange.payload, "taxed": round(exchange.payload["cents"] * 1.1)}

    def total(exchange: Exchange) -> dict[str, Any]:
        """After the aggregate: the payload is the merged result; headers and properties are those before the split."""
        merged = exchange.payload
        record(f"total {merged['correlation_id']}")
        ok = [item["result"] for item in merged["items"] if item["status"] == "ok"]
        return {
            "order_id": merged["correlation_id"],
            "status": merged["status"],
            "reason": merged["reason"],
            "cents": sum(result["cents"] for result in ok),
            "taxed": sum(result["taxed"] for result in ok),
            "failed": merged["failed"],
            "missing": merged["missing"],
            "screen": exchange.properties.get("screen"),
            "items_saw_header": all(result["order_header"] == merged["correlation_id"] for result in ok),
        }

    return [
        (
            Flow("orders", source="flow-orders")
            .process("stamp", stamp)
            .split("items", payload("items"), correlate_by=payload("order_id"), chunk=3)
            .process("price", price)
            .process("tax", tax)
            .aggregate("order-total", timeout_ms=timeout_ms)
            .process("total", total)
            .to("priced-orders")
        ),
        (
            Flow("audit", source="audit-in")
            .barrier("await-order", correlate_by=header("order-id"), awaits=["flow-orders"], timeout_ms=timeout_ms * 2)
            .to("audited")
        ),
    ]


FLOWS = make_flows(timeout_ms=TIMEOUT_MS)
