"""The split/aggregate pipeline of an application: its item step, compiled once per worker (:mod:`app.pipeline`)."""

from __future__ import annotations

from weir.app.application import Application
from weir.app.pipeline import PipelineTopology, as_is

__all__ = ["pipeline"]


def pipeline(application: Application) -> PipelineTopology:
    """The application's pipeline, shared by its splitter, items and aggregator stages (default item step: as is)."""
    return application.shared("pipeline", lambda: PipelineTopology(application.item_processor or as_is, application.wiring))
