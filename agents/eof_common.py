"""The end-of-stream jobs of ``WEIR_EOF_JOB``, compiled once per worker (:mod:`app.eof_topology`)."""

from __future__ import annotations

import functools

from weir.app.core import settings
from weir.app.eof_topology import EofTopology, load_job, parse_jobs
from weir.app.serve import worker_wiring

__all__ = ["jobs"]


@functools.cache
def jobs() -> list[EofTopology]:
    """Every job this deployment runs (``WEIR_EOF_JOB``: ``module:NAME`` for the unnamed job, ``name=module:NAME`` for
    more); an eof_* agent without one refuses to start (weir has no default job)."""
    entries = parse_jobs(settings.eof_job)
    if not entries:
        message = (
            "setting WEIR_EOF_JOB is not set: the eof_* agents run the end-of-stream job(s) it names, "
            "'module:NAME' of a tables.eof.EofJob, or 'name=module:NAME,...' for several (weir has no default job)"
        )
        raise ValueError(message)
    wiring = worker_wiring()
    return [EofTopology(load_job(spec), wiring, name=name) for name, spec in entries]
