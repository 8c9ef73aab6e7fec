"""Flows whose barrier awaits each flow under its own key (seed 004), for tests/unit/driver/test_barrier_own_keys_driver.py.

``gate`` holds a dispatch until the kitchen finished its order (key: ``order_id``) and the payment its
payment reference (key: ``payment_ref``): one exchange, two keys, two partitions of the barrier topic.
"""

from __future__ import annotations

import os

from weir.app.flows import Await, Exchange, Flow, payload

TIMEOUT_MS = int(os.environ.get("TEST_BARRIER_TIMEOUT_MS", "30000"))


def noop(exchange: Exchange) -> None:
    return None


FLOWS = [
    Flow("cook", source="cook-in").process("cook", noop),
    Flow("pay", source="pay-in").process("pay", noop),
    (
        Flow("ship", source="ship-in")
        .barrier(
            "gate",
            awaits=[Await("cook-in", key=payload("order_id")), Await("pay-in", key=payload("payment_ref"))],
            timeout_ms=TIMEOUT_MS,
        )
        .to("shipped")
    ),
]
