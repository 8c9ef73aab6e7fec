"""Per-item workers: the item step on every item, with retries (:meth:`app.pipeline.PipelineTopology.items_stage`)."""

from __future__ import annotations

from weir.agents.pipeline_common import PIPELINE
from weir.app.serve import serve

serve([PIPELINE.items_stage()])
