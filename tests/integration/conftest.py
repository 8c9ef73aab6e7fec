"""Fixtures for end-to-end tests: unique topic/app names per test and real `faust worker` subprocesses."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from weir.app.kafka_io import delete_topics
from weir.app.processes import WorkerProcess, stop_all

#: Ports handed out by :func:`free_port` in this process (a worker may not have bound its port yet).
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port for a worker's web server, below the kernel's ephemeral range (32768-60999 on Linux).

    A port the kernel picks for ``bind(0)`` is ephemeral: between this check and the worker's own bind, an
    outgoing connection (any Kafka client's) may take it as its local port, and the worker then fails to
    start ("address already in use"; it happened once). Ports below that range are never given to outgoing
    connections.
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(20_000, 32_000)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free port in 20000-32000")


def exit_code(worker: WorkerProcess, timeout_s: float, *, still: str) -> int:
    """The code ``worker`` exits with; the test fails, with the end of its log, if it still runs ``timeout_s`` later
    (``still``: what that means, e.g. "the worker still runs on a full disk")."""
    assert worker.process is not None
    try:
        return worker.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{still}:\n{worker.log_text()[-3000:]}")


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive free ports below the ephemeral range (a demo's workers take base + N)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(20_000, 32_000 - count)
        ports = range(base, base + count)
        if any(port in _HANDED_OUT for port in ports):
            continue
        free = True
        for port in ports:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    free = False
                    break
        if free:
            _HANDED_OUT.update(ports)
            return base
    message = f"no {count} consecutive free ports in 20000-32000"
    raise RuntimeError(message)


@dataclass
class Pipeline:
    """A private weir deployment for one test: its own topic prefix, app id, data dir and workers."""

    bootstrap: str
    tmp: Path
    prefix: str
    app_id: str
    workers: list[WorkerProcess] = field(default_factory=list)

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
                # each test its own outbox database, hence its own default status store for the triggers' sweep
                "WEIR_OUTBOX_DB": str(self.tmp / "outbox.sqlite"),
            }
        )
        env.update({key: str(value) for key, value in overrides.items()})
        return env

    def start_worker(self, agents: str = "all", web_port: int | None = None, *, entry: str = "app.main", **overrides: Any) -> WorkerProcess:
        """A worker of ``agents``; ``web_port``: a killed worker's, to restart it in its slot (its default
        transactional id, ``<host>-<port>``, is the killed worker's: the restart ends its open transaction);
        ``entry``: the worker's entry module (``shop.main`` for the shop's stages)."""
        index = len(self.workers)
        name = f"w{index}-{agents.replace(',', '+')}"
        data_dir = self.tmp / f"data-{name}"
        env = self.env(WEIR_AGENTS=agents, WEIR_DATA_DIR=data_dir, **overrides)
        worker = WorkerProcess(agents, env, self.tmp / f"{name}.log", web_port=web_port or free_port(), entry=entry)
        self.workers.append(worker.start())
        return worker

    def stop_all(self) -> None:
        stop_all(self.workers)


@pytest.fixture
def pipeline(kafka_bootstrap: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    unique = uuid.uuid4().hex[:8]
    deployment = Pipeline(bootstrap=kafka_bootstrap, tmp=tmp_path, prefix=f"t{unique}.", app_id=f"t{unique}")
    yield deployment
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        # Each live worker logs its asyncio tasks and consumer positions (app.core.dump_tasks) before it stops.
        for worker in deployment.workers:
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGUSR1)
        time.sleep(2)
    deployment.stop_all()
    if report is not None and report.failed:
        for worker in deployment.workers:
            text = worker.log_text()
            # Warnings and errors from the whole run (the tail alone missed what happened mid-run).
            notable = [line for line in text.splitlines() if "[WARNING]" in line or "[ERROR]" in line or "Traceback" in line]
            notable = [line for line in notable if "producer buffer full" not in line][-60:]
            sys.stderr.write(f"\n----- {worker.log_path.name} (warnings and errors) -----\n" + "\n".join(line[:400] for line in notable))
            sys.stderr.write(f"\n----- {worker.log_path.name} (tail) -----\n{text[-6000:]}\n")
    # The broker keeps every partition's files open: a suite that left its topics behind ran into its open-file
    # limit. WEIR_KEEP_TEST_TOPICS=1 keeps them (to look at a failure).
    try:
        if not os.environ.get("WEIR_KEEP_TEST_TOPICS"):
            asyncio.run(delete_topics(kafka_bootstrap, f"t{unique}"))
    except Exception as error:  # a test that stopped the broker; the next session's broker starts clean anyway
        sys.stderr.write(f"could not delete the topics of t{unique}: {error}\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
