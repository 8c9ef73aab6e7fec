"""Fixtures for end-to-end tests: unique topic/app names per test and real `faust worker` subprocesses."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.conftest import ROOT

FAUST = Path(sys.executable).parent / "faust"

#: The open defect behind the SIGKILL takeover tests (see the README and the issue notes).
KNOWN_TAKEOVER_DEFECT = (
    "open defect (see the README and the issue note): after a SIGKILL takeover, in about one run in three, Faust "
    "drops records fetched around the rebalance and later commits past them, or never commits a partition again; "
    "seen under exactly_once and at_least_once. Results are then lost (groups complete partial at their deadline) "
    "or stay in an open transaction."
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Worker:
    """One `faust -A app.main worker` process; its log is kept for the test report."""

    name: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> Worker:
        self._log = self.log_path.open("ab")
        command = [str(FAUST), "-A", "app.main", "worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", str(free_port())]
        self.process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = 60.0, *, occurrences: int = 1) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.log_text().count("Worker ready") >= occurrences:
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.process.returncode}:\n{self.log_text()[-4000:]}")
            time.sleep(0.2)
        raise AssertionError(f"worker {self.name} not ready after {timeout_s}s:\n{self.log_text()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash looks like to the group and the broker."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class Pipeline:
    """A private weir deployment for one test: its own topic prefix, app id, data dir and workers."""

    bootstrap: str
    tmp: Path
    prefix: str
    app_id: str
    workers: list[Worker] = field(default_factory=list)

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def env(self, **overrides: Any) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "KAFKA_BOOTSTRAP": self.bootstrap,
                "WEIR_TOPIC_PREFIX": self.prefix,
                "WEIR_APP_ID": self.app_id,
                "WEIR_ITEM_PROCESSOR": "tests.integration.processors:test_step",
                "WEIR_SESSION_TIMEOUT": "6",
                "WEIR_HEARTBEAT_INTERVAL": "0.5",
                "WEIR_REBALANCE_TIMEOUT": "10",
                "WEIR_RETRY_BACKOFF_MS": "20",
                "PYTHONPATH": str(ROOT),
            }
        )
        env.update({key: str(value) for key, value in overrides.items()})
        return env

    def start_worker(self, agents: str = "all", **overrides: Any) -> Worker:
        index = len(self.workers)
        name = f"w{index}-{agents.replace(',', '+')}"
        data_dir = self.tmp / f"data-{name}"
        worker = Worker(name, self.env(WEIR_AGENTS=agents, WEIR_DATA_DIR=data_dir, **overrides), self.tmp / f"{name}.log")
        self.workers.append(worker.start())
        return worker

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def pipeline(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    unique = uuid.uuid4().hex[:8]
    deployment = Pipeline(bootstrap=kafka_bootstrap, tmp=tmp_path, prefix=f"t{unique}.", app_id=f"t{unique}")
    yield deployment
    deployment.stop_all()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for worker in deployment.workers:
            sys.stderr.write(f"\n----- {worker.name} log (tail) -----\n{worker.log_text()[-6000:]}\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
