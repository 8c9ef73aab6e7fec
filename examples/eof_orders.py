"""An end-of-stream job: ice-cream order lines, scoops per flavour per client, priced by the client's list.

Each record the gateway sends is one JSON line, an order ``{"order_id", "time": "HH:MM", "items": [{"flavour",
"scoops"}]}``. The filter keeps the orders taken within opening hours whose flavours are in the catalogue;
the group-by/aggregate stage sums the scoops per flavour; the joiner prices them with the price list the
gateway sent for the client (its side data; none: the catalogue's prices). The eof_* agents run it with
``WEIR_EOF_JOB=examples.eof_orders:ORDERS``; a job of one's own is an :class:`tables.eof.EofJob` of the same shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shop.catalogue import CATALOGUE_CENTS
from weir.tables.eof import Dropped, EofJob, is_count

__all__ = ["OpeningHours", "HOURS", "parse_order", "zero", "merge", "join", "parse_prices", "ORDERS", "JOB_SETTING"]


@dataclass(frozen=True)
class OpeningHours:
    """Orders are accepted from ``opens`` (inclusive) to ``closes`` (exclusive), as "HH:MM" strings."""

    opens: str = "10:00"
    closes: str = "22:00"

    def accepts(self, clock: str) -> bool:
        return self.opens <= clock < self.closes


HOURS = OpeningHours()


def _is_clock(value: Any) -> bool:
    if not isinstance(value, str) or len(value) != 5 or value[2] != ":":
        return False
    hours, minutes = value[:2], value[3:]
    return hours.isdigit() and minutes.isdigit() and int(hours) < 24 and int(minutes) < 60


def parse_order(line: Any, catalogue: Mapping[str, int] = CATALOGUE_CENTS, hours: OpeningHours = HOURS) -> dict[str, Any]:
    """The order on one line, as the record the filter forwards (``{"order_id", "time", "items": [[flavour,
    scoops], ...]}``); raises :class:`Dropped` saying why the filter drops the line."""
    if not isinstance(line, str):
        raise Dropped(f"a line must be a string, got {type(line).__name__}")
    try:
        raw = json.loads(line)
    except ValueError as error:
        raise Dropped(f"broken line: {error}") from None
    if not isinstance(raw, dict):
        raise Dropped(f"an order must be a JSON object, got {type(raw).__name__}")
    order_id = raw.get("order_id")
    if not isinstance(order_id, str) or not order_id:
        raise Dropped(f"'order_id' must be a non-empty string, got {order_id!r:.60}")
    clock = raw.get("time")
    if not isinstance(clock, str) or not _is_clock(clock):
        raise Dropped(f"order {order_id!r}: 'time' must be 'HH:MM', got {clock!r:.60}")
    if not hours.accepts(clock):
        raise Dropped(f"order {order_id!r}: {clock} is outside opening hours {hours.opens}-{hours.closes}")
    items = raw.get("items")
    if not isinstance(items, list) or not items:
        raise Dropped(f"order {order_id!r}: 'items' must be a non-empty list")
    parsed: list[list[Any]] = []
    for number, item in enumerate(items):
        flavour = item.get("flavour") if isinstance(item, dict) else None
        scoops = item.get("scoops") if isinstance(item, dict) else None
        if flavour not in catalogue:
            raise Dropped(f"order {order_id!r} item {number}: unknown flavour {flavour!r:.60}")
        if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
            raise Dropped(f"order {order_id!r} item {number}: 'scoops' must be a positive integer, got {scoops!r:.60}")
        parsed.append([str(flavour), scoops])
    return {"order_id": order_id, "time": clock, "items": parsed}


def zero() -> dict[str, Any]:
    return {"orders": 0, "scoops": {}}


def merge(totals: dict[str, Any], order: Mapping[str, Any]) -> dict[str, Any]:
    """One order more: its scoops added per flavour."""
    scoops = totals["scoops"]
    for flavour, number in order["items"]:
        scoops[flavour] = scoops.get(flavour, 0) + int(number)
    totals["orders"] += 1
    return totals


def parse_prices(raw: Any) -> dict[str, int] | None:
    """A price list (flavour -> cents per scoop, non-negative integers), or None when ``raw`` is not one."""
    if not isinstance(raw, dict):
        return None
    if not all(isinstance(flavour, str) and is_count(cents) for flavour, cents in raw.items()):
        return None
    return dict(raw)


def join(client: str, totals: Mapping[str, Any], side: Any) -> dict[str, Any]:
    """The report's fields: scoops and revenue per flavour, priced with the client's list (``side``; None: the
    catalogue's). A flavour sold but missing from the list is counted at 0 cents and named in ``unpriced``."""
    prices = CATALOGUE_CENTS if side is None else parse_prices(side)
    if prices is None:
        raise ValueError(f"the side data of client {client!r} must be a price list (flavour -> cents per scoop, a count)")
    scoops: Mapping[str, int] = totals["scoops"]
    flavours = {flavour: {"scoops": count, "revenue_cents": count * prices.get(flavour, 0)} for flavour, count in sorted(scoops.items())}
    return {
        "orders": totals["orders"],
        "flavours": flavours,
        "revenue_cents": sum(entry["revenue_cents"] for entry in flavours.values()),
        "unpriced": sorted(flavour for flavour in scoops if flavour not in prices),
    }


#: The job.
ORDERS = EofJob("ice-cream orders", select=parse_order, zero=zero, merge=merge, join=join)
#: The setting that names it.
JOB_SETTING = "examples.eof_orders:ORDERS"
