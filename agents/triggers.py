"""Counter triggers and their safety sweep (:class:`app.trigger_topology.TriggerTopology`); the sweep reads the children's
statuses from ``WEIR_TRIGGER_STATUS_DB`` (none: the sweep fires nothing)."""

from __future__ import annotations

from weir.app.core import settings
from weir.app.serve import serve, worker_wiring
from weir.app.trigger_status import open_status_source
from weir.app.trigger_topology import TriggerTopology

__all__ = ["topology", "stats"]

topology = TriggerTopology(
    worker_wiring(), status_source=(lambda: open_status_source(settings.trigger_status_db)) if settings.trigger_status_db else None
)
#: what this worker's trigger consumer did (/metrics reads its firings by cause)
stats = topology.stats
serve(topology.stages())
