"""The split/aggregate pipeline of this worker: the item step ``WEIR_ITEM_PROCESSOR`` names, compiled once (:mod:`app.pipeline`)."""

from __future__ import annotations

from weir.app.core import settings
from weir.app.pipeline import PipelineTopology, load_processor
from weir.app.serve import worker_wiring

__all__ = ["PIPELINE"]

PIPELINE = PipelineTopology(load_processor(settings.item_processor), worker_wiring())
