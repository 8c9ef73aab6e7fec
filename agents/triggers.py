"""Counter triggers and their safety sweep (:class:`app.trigger_topology.TriggerTopology`); the sweep reads the children's
statuses from the application's ``trigger_status`` (by default the outbox's database; on the command line
``WEIR_TRIGGER_STATUS_DB``, ``none``: the sweep fires nothing)."""

from __future__ import annotations

from weir.app import metrics
from weir.app.application import Application
from weir.app.stages import Stage
from weir.app.trigger_topology import TriggerTopology

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    topology = TriggerTopology(application.wiring, status_source=application.trigger_status)
    # The trigger consumer counts its firings by cause itself (topology.stats); /metrics reads them at scrape time.
    metrics.TRIGGER_FIRES.read = lambda: dict(topology.stats.fired)
    return topology.stages()
