"""What the shop's agents share: the shop's settings, and its stages on this worker's wiring."""

from __future__ import annotations

import functools

from shop.settings import ShopSettings
from shop.stages import ShopStages
from weir.app.serve import worker_wiring

__all__ = ["shop_settings", "shop_stages"]

#: The shop's settings, read once when a worker imports its agents (weir's are ``weir.app.core.settings``).
shop_settings = ShopSettings.from_env()


@functools.cache
def shop_stages() -> ShopStages:
    """The shop's stages and topics on this worker's wiring (one Faust topic per name, created at start)."""
    return ShopStages(worker_wiring(), shop_settings)
