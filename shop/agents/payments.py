"""Shop payment gateway: its stage (:meth:`shop.stages.ShopStages.payments_stage`) served by this worker."""

from __future__ import annotations

import shop.tables.payments  # noqa: F401  (its web view)
from shop.agents.common import shop_stages
from weir.app.serve import serve

__all__: list[str] = []

serve([shop_stages().payments_stage()])
