"""Per-item workers: the item step on every item, with retries (:meth:`app.pipeline.PipelineTopology.items_stage`)."""

from __future__ import annotations

from agents.pipeline_common import PIPELINE
from app.serve import serve

serve([PIPELINE.items_stage()])
