"""What the shop's agents share: its stages and topics on the application's wiring, built once per worker."""

from __future__ import annotations

from shop.settings import ShopSettings
from shop.stages import ShopStages
from weir.app.application import Application

__all__ = ["shop_stages"]


def shop_stages(application: Application, settings: ShopSettings) -> ShopStages:
    """The shop's stages and topics on ``application``'s wiring (one Faust topic per name, created at start)."""
    return application.shared("shop", lambda: ShopStages(application.wiring, settings))
