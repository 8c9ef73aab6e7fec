"""Per-item workers: the item step on every item, with retries
(:meth:`app.pipeline.PipelineTopology.items_stage`)."""

from __future__ import annotations

from weir.agents.pipeline_common import pipeline
from weir.app.application import Application
from weir.app.stages import Stage

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    return [pipeline(application).items_stage()]
