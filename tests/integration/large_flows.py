"""A flow whose outputs outgrow a record batch (WEIR_FLOWS=tests.integration.large_flows): each ``big-in`` record
becomes ``PIECES`` ``big-out`` records of about ``PAD`` bytes, more than one record batch's worth
(``app.engine.produce.BATCH_BYTES``) from one event."""

from __future__ import annotations

from typing import Any

from weir.app.flows import Exchange, Flow

PIECES = 20
PAD = 60_000


def pieces(exchange: Exchange) -> list[dict[str, Any]]:
    return [{"n": exchange.payload["n"], "piece": piece, "pad": "x" * PAD} for piece in range(PIECES)]


FLOWS = [Flow("big", source="big-in").to("big-out", each=pieces)]
