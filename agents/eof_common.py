"""The end-of-stream jobs of an application, compiled once per worker (:mod:`app.eof_topology`)."""

from __future__ import annotations

from weir.app.application import Application
from weir.app.eof_topology import EofTopology

__all__ = ["jobs"]


def jobs(application: Application) -> list[EofTopology]:
    """Every job the application runs (``eof_jobs``; on the command line ``WEIR_EOF_JOB``: ``module:NAME`` for the unnamed
    job, ``name=module:NAME`` for more); an eof_* agent without one refuses to start (weir has no default job)."""
    if not application.eof_jobs:
        message = "the eof_* agents run the end-of-stream jobs of Application(eof_jobs=...): none given (weir has no default job)"
        raise ValueError(message)
    return application.shared(
        "eof-jobs", lambda: [EofTopology(job, application.wiring, name=name) for name, job in application.eof_jobs.items()]
    )
