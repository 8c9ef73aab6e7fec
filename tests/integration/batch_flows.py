"""The correlation-aggregate flow the batch tests run in real workers (WEIR_FLOWS=tests.integration.batch_flows).

``clicks`` (keyed by anything) are grouped by their payload's ``customer``: every 3 a batch, or fewer when one
says ``end``; the key reopens at once (``groups="reopening"``). Each batch goes to ``click-batches``.
"""

from __future__ import annotations

from typing import Any

from weir.app.flows import Exchange, Flow, payload


def summarise(exchange: Exchange) -> dict[str, Any]:
    """The batch as the tests read it: whose, which number, which clicks in order, why it closed."""
    merged = exchange.payload
    return {
        "customer": merged["correlation_id"],
        "sequence": merged["sequence"],
        "reason": merged["reason"],
        "clicks": [item["result"]["n"] for item in merged["items"]],
        "first_header": exchange.headers.get("source"),
    }


FLOWS = [
    Flow("clicks", source="clicks")
    .aggregate(
        "per-customer", correlate_by=payload("customer"), groups="reopening", complete_size=3, complete_on=payload("end"), timeout_ms=None
    )
    .process("summarise", summarise)
    .to("click-batches"),
]
