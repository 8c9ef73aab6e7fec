"""The shop's flavour catalogue: price per scoop in cents (the demo's, the EOF reports' and the shop's)."""

from __future__ import annotations

__all__ = ["CATALOGUE_CENTS"]

CATALOGUE_CENTS: dict[str, int] = {
    "vanilla": 250,
    "chocolate": 275,
    "strawberry": 260,
    "pistachio": 320,
    "lemon": 230,
    "mint": 255,
}
