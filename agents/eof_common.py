"""The end-of-stream jobs of ``WEIR_EOF_JOB``, compiled once per worker (:mod:`app.eof_topology`)."""

from __future__ import annotations

from app.core import settings
from app.eof_topology import EofTopology, load_job, parse_jobs
from app.serve import worker_wiring
from tables.eof import TOPIC_AGGREGATE, TOPIC_COUNTER

__all__ = ["JOBS", "aggregate_topic", "counter_topic"]

_wiring = worker_wiring()

#: Every job this deployment runs (``WEIR_EOF_JOB``: ``module:NAME`` for the unnamed job, ``name=module:NAME`` for more).
JOBS: list[EofTopology] = [EofTopology(load_job(spec), _wiring, name=name) for name, spec in parse_jobs(settings.eof_job)]

#: The unnamed job's counter and aggregate topics (a stage of one's own may report to them: the shop's end of day).
counter_topic = _wiring.topic_named(TOPIC_COUNTER)
aggregate_topic = _wiring.topic_named(TOPIC_AGGREGATE)
