"""The EOF joiner of every job of ``WEIR_EOF_JOB`` (:meth:`app.eof_topology.EofTopology.joiner_stage`)."""

from __future__ import annotations

from weir.agents.eof_common import jobs
from weir.app.serve import serve

serve(job.joiner_stage() for job in jobs())
