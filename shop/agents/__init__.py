"""The shop's agents, one module per stage, as agent sets of the shop's application (``WEIR_AGENTS`` names them)."""

from __future__ import annotations

import functools

from shop.agents import claims, kitchen, orders, payments
from shop.settings import ShopSettings
from weir.app.application import AgentSet

__all__ = ["AGENT_MODULES", "agent_sets"]

#: The shop's agent sets: the name ``WEIR_AGENTS`` takes, and the module that declares its stages.
AGENT_MODULES = {"shop_orders": orders, "shop_claims": claims, "shop_payments": payments, "shop_kitchen": kitchen}


def agent_sets(settings: ShopSettings) -> dict[str, AgentSet]:
    """The shop's agent sets on its ``settings``, for :class:`weir.Application`'s ``agent_sets``."""
    return {name: functools.partial(module.stages, settings=settings) for name, module in AGENT_MODULES.items()}
