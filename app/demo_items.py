"""The demos' item step (``make demo-split``, the benchmarks): price an ice-cream item from the shop's catalogue.

Not a library default: name it with ``WEIR_ITEM_PROCESSOR=app.demo_items:price_item``.
"""

from __future__ import annotations

from typing import Any

from app.catalogue import CATALOGUE_CENTS

__all__ = ["price_item", "STEP"]

#: The setting that names this step.
STEP = "app.demo_items:price_item"


def price_item(payload: Any) -> dict[str, Any]:
    """Price an ice-cream item (``{"flavour", "scoops"}``) from the catalogue."""
    flavour = payload.get("flavour") if isinstance(payload, dict) else None
    scoops = payload.get("scoops") if isinstance(payload, dict) else None
    if flavour not in CATALOGUE_CENTS:
        message = f"item step 'price': unknown flavour {flavour!r}, expected one of {sorted(CATALOGUE_CENTS)}"
        raise ValueError(message)
    if not isinstance(scoops, int) or isinstance(scoops, bool) or scoops <= 0:
        message = f"item step 'price': 'scoops' must be a positive integer, got {scoops!r}"
        raise ValueError(message)
    return {"flavour": flavour, "scoops": scoops, "price_cents": CATALOGUE_CENTS[flavour] * scoops}
