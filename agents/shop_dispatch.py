"""Shop dispatch: the shop's flows (app/shop_flows.py) on weir's flow agents, each order's two-phase commit.

``WEIR_AGENTS=shop_dispatch`` is the "flows" agent set with ``WEIR_FLOWS=app.shop_flows`` (app/settings.py): the
capture first; only once captured, the kitchen's reservations; then deliver and commit, or void and restock. The
waits are the flow barriers' (tables/barrier.py), nothing of the shop's own.
"""

from __future__ import annotations

from agents import flows

__all__ = ["flows"]
