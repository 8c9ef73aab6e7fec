"""The application's windowed aggregations (``windows``; on the command line the ``WINDOWS`` lists of ``WEIR_WINDOWS``),
served as agents (:mod:`app.windows`)."""

from __future__ import annotations

from weir.app.application import Application
from weir.app.stages import Stage
from weir.app.windows import WindowTopology

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    if not application.windows:
        message = "the windows agent runs the windows of Application(windows=...), on the command line those of WEIR_WINDOWS: none given"
        raise ValueError(message)
    return WindowTopology(application.windows, application.wiring).stages()
