"""Aggregator: merges item outcomes by correlation id; completes by count, last flag or timeout
(:meth:`app.pipeline.PipelineTopology.aggregator_stage`)."""

from __future__ import annotations

from weir.agents.pipeline_common import pipeline
from weir.app.application import Application
from weir.app.stages import Stage

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    return [pipeline(application).aggregator_stage()]
