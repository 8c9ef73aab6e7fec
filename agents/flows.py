"""The flows of ``WEIR_FLOWS`` (the ``FLOWS`` lists of one module or several; ``WEIR_FLOWS_RUN`` picks some), served as agents
(:mod:`app.flow_topology`)."""

from __future__ import annotations

from app.core import settings
from app.flow_topology import FlowTopology, load_flows
from app.flows import FlowGraphError
from app.serve import serve, worker_wiring

__all__ = ["topology"]

_declared = load_flows(settings.flows_module)
_unknown = sorted(set(settings.flows_run) - {flow.name for flow in _declared})
if _unknown:
    raise FlowGraphError(
        f"WEIR_FLOWS_RUN names flow(s) {_unknown} that {settings.flows_module!r} does not declare; it has {[f.name for f in _declared]}"
    )

topology = FlowTopology(_declared, worker_wiring(), runs=settings.flows_run)
serve(topology.stages())
