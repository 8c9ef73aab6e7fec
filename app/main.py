"""Worker entry point: ``faust -A app.main worker`` runs the agents that ``WEIR_AGENTS`` names."""

from __future__ import annotations

import importlib

from app import web  # noqa: F401  (the read-only /weir/ views)
from app.core import app, settings

__all__ = ["app"]

for _agent in settings.agents:
    importlib.import_module(f"agents.{_agent}")
