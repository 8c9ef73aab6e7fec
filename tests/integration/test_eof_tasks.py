"""`make demo-eof` on the real broker: two end-of-stream tasks at once on shared stages, one answered by its filter.

What only the broker shows: the gateway assembling a filter-answered client from its parts and the controller's end
as they come over Kafka (read_committed, any partition order), beside a joiner-answered task on the same workers.
The tasks' logic runs on the driver: tests/unit/driver/test_eof_driver.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import free_port_block

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_two_tasks_at_once_give_each_client_both_reports_equal_to_the_reference(kafka_bootstrap: str) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "WEIR_DEMO_WEB_PORT": str(free_port_block(3)),
        "WEIR_SESSION_TIMEOUT": "6",
        "WEIR_HEARTBEAT_INTERVAL": "0.5",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "examples.eof_tasks", "--clients", "3", "--orders", "120", "--timeout", "120"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.count("scoops = reference; big = reference") == 3
    assert "big     complete:" in done.stdout
