"""The windowed aggregations of ``WEIR_WINDOWS`` (the ``WINDOWS`` lists of one module or several), served as agents
(:mod:`app.windows`)."""

from __future__ import annotations

from weir.app.core import settings
from weir.app.serve import serve, worker_wiring
from weir.app.windows import WindowTopology, load_windows

__all__ = ["topology"]

topology = WindowTopology(load_windows(settings.windows_module), worker_wiring())
serve(topology.stages())
