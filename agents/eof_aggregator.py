"""The EOF aggregator of every job of ``WEIR_EOF_JOB`` (:meth:`app.eof_topology.EofTopology.aggregator_stage`)."""

from __future__ import annotations

from weir.agents.eof_common import jobs
from weir.app.serve import serve

serve(job.aggregator_stage() for job in jobs())
