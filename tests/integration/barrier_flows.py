"""The flows the barrier tests run in real workers (WEIR_FLOWS=tests.integration.barrier_flows)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from weir.app.flows import Await, Exchange, Flow, header, payload

TIMEOUT_MS = int(os.environ.get("TEST_BARRIER_TIMEOUT_MS", "30000"))
#: The dispatch barrier's rule for a second exchange of one order while one waits ("reject" is the default).
ON_DUPLICATE: Any = os.environ.get("TEST_BARRIER_ON_DUPLICATE", "reject")

#: Told of each step's execution: (step, order id). The tests count how often steps ran.
Record = Callable[[str, str], None]


def log_to_file(step: str, order_id: str) -> None:
    """Appends one line per step execution to TEST_STEP_LOG (a worker's steps, counted by the broker tests)."""
    path = os.environ.get("TEST_STEP_LOG")
    if path:
        with Path(path).open("a") as log:
            log.write(f"{step} {order_id}\n")


def make_flows(*, timeout_ms: int = 30_000, on_duplicate: Any = "reject", record: Record = log_to_file) -> list[Flow]:
    """The four flows: kitchen and payment, dispatch awaiting both, notify awaiting dispatch."""
    failures_so_far: dict[str, int] = {}

    def _record(step: str, exchange: Exchange) -> None:
        order = exchange.payload.get("order") or {}
        record(step, str(exchange.headers.get("order-id") or exchange.payload.get("order_id") or order.get("id")))

    def stamp(exchange: Exchange) -> None:
        """The step before the barrier: sets the header the barrier's key reads, and a property."""
        exchange.headers["order-id"] = str(exchange.payload["order_id"])
        exchange.properties["stamped_ms"] = int(time.time() * 1000)
        if exchange.payload.get("inflate"):  # an exchange that grows past what a record may hold before the barrier
            exchange.payload["padding"] = "x" * int(exchange.payload["inflate"])
        _record("stamp", exchange)

    def dispatch_order(exchange: Exchange) -> dict[str, Any]:
        _record("dispatch", exchange)
        return {**exchange.payload, "dispatched": True, "stamped_ms": exchange.properties.get("stamped_ms")}

    def cook(exchange: Exchange) -> None:
        _record("cook", exchange)
        if exchange.payload.get("fail"):
            raise RuntimeError(f"kitchen cannot cook {exchange.headers.get('order-id')}")

    def authorize(exchange: Exchange) -> None:
        """Fails ``fail_times`` times for an order, then succeeds (or always, with ``fail``)."""
        order_id = str(exchange.payload["order"]["id"])
        _record("authorize", exchange)
        if exchange.payload.get("fail"):
            raise RuntimeError(f"card declined for {order_id}")
        failed = failures_so_far.get(order_id, 0)
        if failed < int(exchange.payload.get("fail_times", 0)):
            failures_so_far[order_id] = failed + 1
            raise RuntimeError(f"payment gateway busy for {order_id} (try {failed + 1})")

    return [
        Flow("kitchen", source="kitchen").process("cook", cook),
        Flow("payment", source="payment").process("authorize", authorize),
        (
            Flow("dispatch", source="dispatch-in")
            .process("stamp", stamp)
            .barrier(
                "await-kitchen-and-payment",
                correlate_by=header("order-id"),
                awaits=["kitchen", Await("payment", key=payload("order.id"))],
                timeout_ms=timeout_ms,
                on_duplicate=on_duplicate,
            )
            .process("dispatch-order", dispatch_order)
            .to("dispatched")
        ),
        (
            Flow("notify", source="notify-in")
            .barrier("await-dispatch", correlate_by=header("order-id"), awaits=["dispatch-in"], timeout_ms=timeout_ms * 3)
            .to("notified")
        ),
    ]


FLOWS = make_flows(timeout_ms=TIMEOUT_MS, on_duplicate=ON_DUPLICATE)
