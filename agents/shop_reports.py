"""Shop end of day: each screen's outcomes counted once per line; the report goes out when the screen's end says how many."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.shop_common import outputs, shop_topics
from app.core import InvalidMessage, app, handle_events
from app.runtime.keyed import Change, KeyedState, TableStore
from tables.shop import ScreenReport, on_end, on_outcome
from tables.shop_report_tables import reports

__all__ = ["shop_reports"]

AGENT = "shop_reports"
screens: KeyedState[ScreenReport] = KeyedState(
    agent=AGENT, store=TableStore(reports, ScreenReport.to_dict, ScreenReport.from_dict), step="report"
)


async def _handle(event: EventT[bytes], message: Any) -> None:
    if not isinstance(message, dict) or not isinstance(message.get("screen"), str):
        raise InvalidMessage("shop reports: a message must be a JSON object with a string 'screen'")
    screen = message["screen"]
    previous = screens.load(screen)
    kind = message.get("kind")
    if kind == "outcome":
        line, status, amount = message.get("line"), message.get("status"), message.get("amount_cents")
        if not isinstance(line, int) or not isinstance(status, str) or not isinstance(amount, int):
            raise InvalidMessage(f"shop reports: outcome of screen {screen!r} needs 'line' (int), 'status' (str), 'amount_cents' (int)")
        state, sends = on_outcome(previous, screen, line, status, message.get("reason"), amount)
    elif kind == "end":
        lines = message.get("lines")
        if not isinstance(lines, int) or lines < 0:
            raise InvalidMessage(f"shop reports: end of screen {screen!r} needs a non-negative integer 'lines'")
        state, sends = on_end(previous, screen, lines)
    else:
        raise InvalidMessage(f"shop reports: 'kind' must be 'outcome' or 'end', got {kind!r:.60}")
    await screens.apply(event, screen, previous, Change(state=state, outputs=outputs(sends)))


@app.agent(shop_topics["screens"])
async def shop_reports(stream: StreamT[bytes]) -> None:
    """Reads the outcomes of each screen's lines and its end of day, keyed by screen."""
    await handle_events(stream, agent=AGENT, what="shop reports: message", handler=_handle)
