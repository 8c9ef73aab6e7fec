"""The shop's claims stage (:mod:`shop.stages.claims`) served by this worker."""

from __future__ import annotations

import shop.tables.views  # noqa: F401  (the shop tables' web views)
from shop.agents.common import shop_stages
from weir.app.serve import serve

__all__: list[str] = []

serve([shop_stages().claims_stage()])
