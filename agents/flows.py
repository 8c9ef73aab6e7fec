"""The flows of ``WEIR_FLOWS`` (the ``FLOWS`` lists of one module or several; ``WEIR_FLOWS_RUN`` picks some), served as agents
(:mod:`app.flow_topology`)."""

from __future__ import annotations

from weir.app.core import settings
from weir.app.flow_topology import FlowTopology, load_flows
from weir.app.serve import serve, worker_wiring

__all__ = ["topology"]

topology = FlowTopology(load_flows(settings.flows_module), worker_wiring(), runs=settings.flows_run)
serve(topology.stages())
