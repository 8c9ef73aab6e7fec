"""The state disk fills up under a running worker (issue 37): the worker stops with a clear error instead of
going on with a store that cannot be written, and once space is freed a restart resumes with nothing lost and
nothing twice.

The worker's ``WEIR_DATA_DIR`` is a small tmpfs mounted for the test (root only: CI runs as root); a ballast file
fills it once the worker runs, so its RocksDB stores fail on their next write ("IO error: No space left on device").
The worker crashes on it, but mode restarts the failed agent and the worker does not stop by itself: its process
ends by the engine's crash timer (app/engine/exits.py), which this test also proves (it used to run on for good).
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline, exit_code
from weir.app.kafka_io import ensure_topics, produce_json, read_to_end

#: the broker-fault runs go one after another, beside the shop's group on the other test process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("faults")]

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
GROUPS = [f"g-{number}" for number in range(40)]
PARTS = 4
PAYLOAD = "x" * 20_000  # each part's result: the stores grow fast


@pytest.fixture
def small_disk(pipeline: Pipeline) -> Iterator[Path]:
    """A 48 MB tmpfs where the pipeline's first worker keeps its state (``WEIR_DATA_DIR``, see ``start_worker``)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root (CI runs as root)")
    mount = pipeline.tmp / "data-w0-aggregator"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount
    finally:
        pipeline.stop_all()
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> int:
    """Write zeros to ``path`` until the file system is full; the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as ballast:
        while True:
            try:
                written += ballast.write(chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                return written


def part(group: str, index: int) -> tuple[str, dict[str, Any]]:
    return (group, {"kind": "item", "correlation_id": group, "index": index, "total": PARTS, "ok": True, "result": PAYLOAD})


def aggregates(pipeline: Pipeline) -> list[dict[str, Any]]:
    return [orjson.loads(record.value) for record in asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates")))]


def test_a_full_state_disk_stops_the_worker_and_a_restart_after_it_is_freed_loses_nothing(pipeline: Pipeline, small_disk: Path) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    worker = pipeline.start_worker("aggregator", WEIR_AGGREGATE_TIMEOUT_MS=600_000)
    assert worker.log_path.stem == "w0-aggregator", "its state is on the small disk"
    worker.wait_ready()
    ballast = small_disk / "ballast"
    assert fill(ballast) > 0
    deadline_ms = int(time.time() * 1000) + 600_000
    opens = [(group, {"kind": "open", "correlation_id": group, "total": PARTS, "deadline_ms": deadline_ms}) for group in GROUPS]
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), opens + [part(group, 0) for group in GROUPS]))
    code = exit_code(worker, 120, still="the worker still runs on a full disk")
    log = worker.log_text()
    assert code != 0
    assert "No space left on device" in log, log[-3000:]
    results_while_full = aggregates(pipeline)
    assert results_while_full == [], "no group can complete with one part of four"

    ballast.unlink()
    worker.start()
    worker.wait_ready()
    parts = [part(group, index) for group in GROUPS for index in range(1, PARTS)]
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), parts))
    deadline = time.monotonic() + 120
    while len(results := aggregates(pipeline)) < len(GROUPS):
        assert time.monotonic() < deadline, f"{len(results)} of {len(GROUPS)} results after the restart"
        time.sleep(0.5)
    time.sleep(2.0)  # a second result would come now
    results = aggregates(pipeline)
    assert Counter(result["correlation_id"] for result in results) == Counter(dict.fromkeys(GROUPS, 1))
    assert {result["status"] for result in results} == {"complete"}, "every part before the full disk was kept"
    assert all(len(result["items"]) == PARTS for result in results)
