"""The EOF aggregator of every end-of-stream job of the application (:meth:`app.eof_topology.EofTopology.aggregator_stage`)."""

from __future__ import annotations

from weir.agents.eof_common import jobs
from weir.app.application import Application
from weir.app.stages import Stage
from weir.tables.eof import ANSWERS_JOINER

__all__ = ["stages"]


def stages(application: Application) -> list[Stage]:
    # a job answered by its filter (EofJob.answered_by_filter) has no aggregate stage
    return [job.aggregator_stage() for job in jobs(application) if job.job.answers == ANSWERS_JOINER]
