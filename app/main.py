"""Worker entry point: ``faust -A app.main worker`` runs the agents that ``WEIR_AGENTS`` names.

The command's edge: the settings and the user code the ``WEIR_*`` variables name are read here, once
(:meth:`app.application.Application.from_env`). A package built on weir writes an entry module of its own that
builds its :class:`app.application.Application` (from the environment, or from values) with its agent sets, and
runs ``faust -A <that module> worker``.
"""

from __future__ import annotations

from weir.app.application import Application
from weir.app.edge import command_edge

__all__ = ["application", "app"]

with command_edge("weir worker"):  # a refused setting: one line and exit 2 (Faust's command line imports this module)
    application = Application.from_env()
    app = application.serve_agents()
