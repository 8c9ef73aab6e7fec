"""Worker entry point: ``faust -A app.main worker`` runs the agents that ``WEIR_AGENTS`` names.

A package built on weir with agents of its own has an entry module that registers them
(:func:`app.settings.register_agent_sets`) and then imports this one.
"""

from __future__ import annotations

import importlib

from weir.app import (
    collector,
    metrics,
    web,  # noqa: F401  (the read-only /weir/ views)
)
from weir.app.core import app, settings
from weir.app.settings import agent_module

__all__ = ["app"]

_loaded = {agent: importlib.import_module(agent_module(agent)) for agent in settings.agents}

if "triggers" in _loaded:
    # The trigger consumer counts its firings by cause itself (agents.triggers.stats); /metrics reads them at scrape
    # time, so that the agent carries no metrics code of its own.
    _trigger_stats = _loaded["triggers"].stats
    metrics.TRIGGER_FIRES.read = lambda: dict(_trigger_stats.fired)


async def _freeze_started() -> None:
    """Once the worker started, its own objects leave the collector's walks (:mod:`app.collector`)."""
    collector.freeze_started()


collector.tune_collector(settings.gc_tuned)
if settings.gc_tuned:
    app.task(_freeze_started)
