"""An item step (``make demo-split``, the benchmarks): price an ice-cream item from the shop's catalogue.

Name it with ``WEIR_ITEM_PROCESSOR=examples.pricing:price_item`` (weir's default step keeps the payload as it is).
"""

from __future__ import annotations

from typing import Any

from shop.catalogue import CATALOGUE_CENTS

__all__ = ["price_item", "STEP"]

#: The setting that names this step.
STEP = "examples.pricing:price_item"


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
