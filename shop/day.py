"""The shop's end of day as an end-of-stream job (seed 000): a screen's day is a client, its lines the batches.

The screen is the gateway: it sends its lines (to the orders stage, keyed by ticket), then its side data (None:
the day's report prices flavours with the catalogue) and "sent N" (N lines, batches 0..N-1). Each line's
one outcome, from whichever stage decided it (orders: invalid; claims: duplicate; dispatch: ready or aborted),
is seed 000's filter output: the outcome forwarded as batch ``<line - 1>.0`` to the group-by/aggregate stage
and "batch <line - 1>: forwarded 1" to the controller, in one transaction (:func:`shop.state.outcome_sends`).
The controller finishes the day once every line is reported; the aggregate stage folds the outcomes into the
day's totals (:func:`shop.state.day_merge`) and flushes them to the joiner, which joins them with the price
list into the report (:func:`shop.state.day_report`). The screen says "delivered", and the cleanup broadcast
reaches the aggregate and join stages and every shard of the day's order ids (shop/agents/claims.py).

The shop's workers run the end-of-stream agents with ``WEIR_EOF_JOB=shop.day:DAY``. A day with no line
decided for ``WEIR_EOF_IDLE_TIMEOUT_MS`` (5 min) is reported ``abandoned``: keep it above an order's longest wait,
twice ``WEIR_SHOP_DISPATCH_TIMEOUT_MS`` (two barriers; 30 s each by default).
"""

from __future__ import annotations

from typing import Any

from shop.catalogue import CATALOGUE_CENTS
from shop.state import claim_shard_keys, day_merge, day_report, day_zero, read_outcome
from weir.tables.eof import Dropped, EofJob, is_count

__all__ = ["DAY", "JOB_SETTING"]

#: The setting the shop's end-of-stream workers run with.
JOB_SETTING = "shop.day:DAY"


def _select(record: Any) -> dict[str, Any]:
    try:
        return read_outcome(record)
    except ValueError as error:
        raise Dropped(str(error)) from None


def _join(screen: str, totals: dict[str, Any], side: Any) -> dict[str, Any]:
    prices = CATALOGUE_CENTS if side is None else side
    if not isinstance(prices, dict) or not all(isinstance(flavour, str) and is_count(cents) for flavour, cents in prices.items()):
        raise ValueError(f"the side data of {screen!r} must be a price list (flavour -> cents per scoop)")
    return day_report(screen, totals, prices)


def _merge(totals: dict[str, Any], record: Any) -> dict[str, Any]:
    # The shop's stages forward outcomes without a filter step of their own: each is read here, and one that is
    # not an outcome fails the day's report (with the error) rather than being miscounted.
    return day_merge(totals, read_outcome(record))


def _cleanups(screen: str) -> list[tuple[str, str]]:
    return [("shop.claims", key) for key in claim_shard_keys(screen)]


DAY = EofJob("shop day", select=_select, zero=day_zero, merge=_merge, join=_join, cleanup_topics=("shop.claims",), cleanups=_cleanups)
