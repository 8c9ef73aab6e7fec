"""The shop's worker entry: ``faust -A shop.main worker`` runs the agents ``WEIR_AGENTS`` names, the shop's and weir's.

The shop's stages are agent sets of its own (:data:`shop.agents.AGENT_SETS`: ``shop_orders``, ``shop_claims``,
``shop_payments``, ``shop_kitchen``), registered here before weir's entry module reads the settings. Its dispatch
is weir's ``flows`` agents running the shop's flows (``WEIR_FLOWS=shop.flows``), its end of day the ``eof_*``
agents running its job (``WEIR_EOF_JOB=shop.day:DAY``): :data:`shop.demo.WORKER_ENV` names both.
"""

from __future__ import annotations

from shop.agents import AGENT_SETS
from weir.app.settings import register_agent_sets

register_agent_sets(AGENT_SETS)

from weir.app.main import app  # noqa: E402  (after the registration: importing it reads WEIR_AGENTS)

__all__ = ["app"]
