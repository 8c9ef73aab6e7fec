"""Two end-of-stream jobs in one deployment (``WEIR_EOF_JOB=words=...,sums=...``): one set of workers, each job's own
topics and tables, each client's report from its own job only. Needs the broker: the workers' names for the jobs'
topics and changelogs must be the ones the gateway uses (the driver's test of the same: tests/unit/driver/test_eof_driver.py)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from tests.integration.conftest import Pipeline
from tests.integration.eof_jobs import SUMS, WORDS, word_lines
from weir.app.eof_gateway import Gateway
from weir.tables.eof import reference_report

pytestmark = pytest.mark.integration


async def _run(pipeline: Pipeline, job: str, clients: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    async with Gateway(pipeline.bootstrap, pipeline.topic, job=job) as gateway:
        reports = await asyncio.gather(
            *(gateway.run_client(client, lines, batch_size=4, timeout_s=120) for client, lines in clients.items())
        )
    return {report["client"]: report for report in reports}


def test_two_jobs_on_one_set_of_workers_keep_their_clients_and_reports_apart(pipeline: Pipeline) -> None:
    env = {
        "WEIR_EOF_JOB": "words=tests.integration.eof_jobs:WORDS,sums=tests.integration.eof_jobs:SUMS",
        "WEIR_EOF_CLOSED_RETENTION_MS": 2000,
    }
    workers = [pipeline.start_worker("eof_filter,eof_controller,eof_aggregator,eof_joiner", **env)]
    for worker in workers:
        worker.wait_ready()
    rng = random.Random(7)
    readers = {f"c-{n}": word_lines(rng, 30 + 7 * n) for n in range(3)}
    counters = {f"c-{n}": [rng.randint(0, 99) if rng.random() < 0.9 else "x" for _ in range(25 + n)] for n in range(3)}

    async def both() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        return await asyncio.wait_for(asyncio.gather(_run(pipeline, "words", readers), _run(pipeline, "sums", counters)), 180)

    words, sums = asyncio.run(both())
    for client, lines in readers.items():
        report = dict(words[client])
        report.pop("batches")
        assert report == reference_report(client, lines, WORDS), client
    for client, numbers in counters.items():
        report = dict(sums[client])
        report.pop("batches")
        assert report == reference_report(client, numbers, SUMS), client
        assert "words" not in report, "the same client id in the other job is another client"
    log = workers[0].log_text()
    assert "stage_eof_filter_words]" in log  # Faust names an agent by its function, shortened in its log when long
    assert "stage_eof_joiner_sums]" in log
