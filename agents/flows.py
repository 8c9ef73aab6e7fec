"""The application's flows (``flows``; on the command line the ``FLOWS`` lists of ``WEIR_FLOWS``, and ``WEIR_FLOWS_RUN``
picks some), served as agents (:mod:`app.flow_topology`)."""

from __future__ import annotations

from weir.app.application import Application
from weir.app.flow_topology import FlowTopology
from weir.app.flows import FlowGraphError
from weir.app.stages import Stage

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    if not application.flows:
        message = "the flows agent runs the flows of Application(flows=...), on the command line those of WEIR_FLOWS: none given"
        raise FlowGraphError(message)
    return FlowTopology(application.flows, application.wiring, runs=application.settings.flows_run).stages()
