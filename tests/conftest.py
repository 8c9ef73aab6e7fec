"""Shared fixtures: the session's real Kafka broker (the project's own, or KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.settings import default_bootstrap

ROOT = Path(__file__).resolve().parent.parent


def _reachable(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """host:port of a real Apache Kafka: KAFKA_BOOTSTRAP if set, else the local one started here.

    A broker this fixture starts is stopped at the end of the session; one already running is left alone.
    """
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        if not _reachable(external):
            pytest.fail(f"KAFKA_BOOTSTRAP={external} is set but nothing answers there")
        yield external
        return
    bootstrap = default_bootstrap()
    already_running = _reachable(bootstrap)
    if not already_running:
        started = subprocess.run([str(ROOT / "scripts" / "broker.sh"), "start"], capture_output=True, text=True, check=False)
        if started.returncode != 0:
            pytest.fail(f"could not start the local Kafka broker:\n{started.stdout}\n{started.stderr}")
    yield bootstrap
    if not already_running:
        subprocess.run([str(ROOT / "scripts" / "broker.sh"), "stop"], capture_output=True, check=False)
