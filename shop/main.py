"""The shop's worker entry: ``faust -A shop.main worker`` runs the agents ``WEIR_AGENTS`` names, the shop's and weir's.

The command's edge: weir's settings and the shop's are read here, once. The shop's stages are agent sets of its own
(:func:`shop.agents.agent_sets`: ``shop_orders``, ``shop_claims``, ``shop_payments``, ``shop_kitchen``), handed to
its :class:`weir.Application`. Its dispatch is weir's ``flows`` agents running the shop's flows
(``WEIR_FLOWS=shop.flows``), its end of day the ``eof_*`` agents running its job (``WEIR_EOF_JOB=shop.day:DAY``):
:data:`shop.demo.WORKER_ENV` names both.
"""

from __future__ import annotations

from shop.agents import agent_sets
from shop.settings import ShopSettings
from weir import Application, command_edge

__all__ = ["application", "app"]

with command_edge("shop worker"):  # a refused setting: one line and exit 2 (Faust's command line imports this module)
    application = Application.from_env(agent_sets=agent_sets(ShopSettings.from_env()))
    app = application.serve_agents()
