"""What the unit tests' process needs before weir's settings are read (the first import of ``app.core``)."""

from __future__ import annotations

import os

# Tests that import the end-of-stream agents in this process need a job to load (weir has no default one): the
# example job, unless the environment names another.
os.environ.setdefault("WEIR_EOF_JOB", "examples.eof_orders:ORDERS")
