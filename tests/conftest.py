"""Shared fixtures: the session's real Kafka broker and PostgreSQL server (the project's own, or KAFKA_BOOTSTRAP / DATABASE_URL)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql

from weir.app.settings import default_bootstrap, default_postgres_url

ROOT = Path(__file__).resolve().parent.parent

# The tests that import the end-of-stream agents in this process (tests/unit/eos) need a job to load (weir has no
# default one): the example job, unless the environment names another. Set here, before any test module imports
# app.core (which reads the settings once); the integration tests' workers name their job themselves.
os.environ.setdefault("WEIR_EOF_JOB", "examples.eof_orders:ORDERS")

# No per-example time limit in the property tests: Hypothesis' default (200 ms) is a timed assertion, and one
# failed on a machine busy with other work (an example that waits on the local PostgreSQL server).
settings.register_profile("weir", deadline=None)
settings.load_profile("weir")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run when ``--dist loadgroup`` would ignore the groups.

    pytest-xdist groups a test by the ``@group`` suffix it adds to the node id; pytest 9.2 no longer reads the attribute
    it writes, and every group was then spread over both test processes without a word (the shop's modules beside
    each other, a module fixture started twice). The pin in pyproject.toml avoids that; this check says so if a
    later upgrade brings it back.
    """
    if not config.getoption("loadgroup", default=False) or not getattr(config, "workerinput", None):
        return
    lost = [item for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    for item in lost:
        item.add_marker(pytest.mark.weir_group_lost)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("weir_group_lost"):
        pytest.fail(
            "--dist loadgroup ignores this test's xdist_group: pytest and pytest-xdist disagree on the node id "
            "(pytest 9.2 with pytest-xdist 3.8); pin the versions in pyproject.toml",
            pytrace=False,
        )


def _cpu_seconds() -> float:
    """This test process's CPU and that of the children it has reaped (the workers and brokers a test started and
    stopped), in seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``WEIR_TEST_CPU_FILE`` set, appends a JSON line per test: its node id, its wall time and the CPU it cost
    (:func:`_cpu_seconds`; the shared broker's is not in it), the pytest process that ran it and when it ended: what
    the suite's time is spent on, and each process's timeline, beside ``--durations``."""
    path = os.environ.get("WEIR_TEST_CPU_FILE")
    if not path:
        return (yield)
    started, cpu = time.monotonic(), _cpu_seconds()
    try:
        return (yield)
    finally:
        row = {
            "test": item.nodeid,
            "wall_s": round(time.monotonic() - started, 2),
            "cpu_s": round(_cpu_seconds() - cpu, 2),
            "process": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "ended_at": round(time.time(), 2),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


@pytest.fixture(autouse=True)
def _commits_not_refused() -> Iterator[None]:
    """A test that stops a worker refuses its commits (``app.engine.scopes.gate.refuse``): the next test's may commit."""
    yield
    scopes = sys.modules.get("weir.app.engine.scopes")
    if scopes is not None:
        scopes.gate.refused = None


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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a real PostgreSQL: DATABASE_URL if set, else the local one (scripts/postgres.sh) started here.

    A server this fixture starts is stopped at the end of the session; one already running is left alone.
    Skipped where PostgreSQL is not installed and installing it needs root (the script's exit status 2).
    """
    external = os.environ.get("DATABASE_URL")
    if external:
        yield external
        return
    url = default_postgres_url()
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    already_running = _reachable(f"127.0.0.1:{port}")
    if not already_running:
        started = subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "start"], capture_output=True, text=True, check=False)
        if started.returncode == 2:
            pytest.skip(f"no PostgreSQL here: {started.stderr.strip()}")
        if started.returncode != 0:
            pytest.fail(f"could not start the local PostgreSQL:\n{started.stdout}\n{started.stderr}")
    yield url
    if not already_running:
        subprocess.run([str(ROOT / "scripts" / "postgres.sh"), "stop"], capture_output=True, check=False)


@pytest.fixture
def postgres_schema(request: pytest.FixtureRequest) -> Iterator[Callable[[], str]]:
    """Makes a fresh schema per call and returns a URL whose search_path is that schema; drops them after."""
    made: list[str] = []

    def new_schema() -> str:
        base = request.getfixturevalue("postgres_url")
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        made.append(name)
        return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{name}"

    yield new_schema
    if made:
        with psycopg.connect(request.getfixturevalue("postgres_url"), autocommit=True) as connection:
            for name in made:
                connection.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))
