"""The shop's agents, one module per stage; ``shop.main`` registers them as agent sets ``WEIR_AGENTS`` can name."""

from __future__ import annotations

__all__ = ["AGENT_SETS"]

#: The shop's agent sets: the name ``WEIR_AGENTS`` takes, and the module that declares its agent.
AGENT_SETS = {
    "shop_orders": "shop.agents.orders",
    "shop_claims": "shop.agents.claims",
    "shop_payments": "shop.agents.payments",
    "shop_kitchen": "shop.agents.kitchen",
}
