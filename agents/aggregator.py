"""Aggregator: merges item outcomes by correlation id; completes by count, last flag or timeout
(:meth:`app.pipeline.PipelineTopology.aggregator_stage`)."""

from __future__ import annotations

from weir.agents.pipeline_common import PIPELINE
from weir.app.serve import serve

serve([PIPELINE.aggregator_stage()])
