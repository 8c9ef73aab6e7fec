"""Flows the barrier benchmark runs: dispatch waits for kitchen and payment by order id."""

from __future__ import annotations

import os

from weir.app.flows import Exchange, Flow, header

TIMEOUT_MS = int(os.environ.get("BENCH_BARRIER_TIMEOUT_MS", str(30 * 60_000)))


def noop(exchange: Exchange) -> None:
    return None


FLOWS = [
    Flow("kitchen", source="kitchen").process("cook", noop),
    Flow("payment", source="payment").process("authorize", noop),
    (
        Flow("dispatch", source="dispatch-in")
        .barrier("await-kitchen-and-payment", correlate_by=header("order-id"), awaits=["kitchen", "payment"], timeout_ms=TIMEOUT_MS)
        .to("dispatched")
    ),
]
