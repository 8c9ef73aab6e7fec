"""The shop's orders stage (:mod:`shop.stages.orders`) as an agent set of the shop's application."""

from __future__ import annotations

import shop.tables.views  # noqa: F401  (the shop tables' web views)
from shop.agents.common import shop_stages
from shop.settings import ShopSettings
from weir.app.application import Application
from weir.app.stages import Stage

__all__ = ["stages"]


def stages(application: Application, settings: ShopSettings) -> list[Stage]:
    return [shop_stages(application, settings).orders_stage()]
