"""The EOF filter of every job of ``WEIR_EOF_JOB`` (:meth:`app.eof_topology.EofTopology.filter_stage`)."""

from __future__ import annotations

from weir.agents.eof_common import jobs
from weir.app.serve import serve

serve(job.filter_stage() for job in jobs())
