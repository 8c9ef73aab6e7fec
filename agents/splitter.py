"""Splitter: an order of N items becomes item messages of up to ``WEIR_SPLIT_CHUNK`` items, or with ``WEIR_ITEMS_INLINE``
the order's result (:meth:`app.pipeline.PipelineTopology.splitter_stage`)."""

from __future__ import annotations

from weir.agents.pipeline_common import pipeline
from weir.app.application import Application
from weir.app.stages import Stage

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    return [pipeline(application).splitter_stage()]
