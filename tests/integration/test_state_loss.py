"""A stopped worker's state directory deleted, then the worker restarted (issue 37): its tables are restored from the
changelogs, key by key equal to each key's last committed changelog value, and the work goes on from them.

Under ``exactly_once`` a worker rebuilds its local tables from the changelog at every start, so the deletion only
takes what it would drop anyway; under ``at_least_once`` the local RocksDB files are kept across restarts and
the deletion is a real loss. Both are run.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import urllib.parse
from collections import Counter
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from tests.integration.test_eof import last_values
from tests.integration.test_web import base, get, wait_for
from weir.app.kafka_io import ensure_topics, produce_json, read_to_end

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
GROUPS = [f"g-{number}" for number in range(12)]
PARTS = 3


def item(group: str, index: int) -> tuple[str, dict[str, Any]]:
    return (group, {"kind": "item", "correlation_id": group, "index": index, "total": PARTS, "ok": True, "result": index})


def table_by_view(worker: Any, table: str) -> dict[str, Any]:
    """Every key of ``table`` as the worker serves it, each with its decoded value."""
    status, listing, _ = get(f"{base(worker)}/weir/tables/{table}/?format=json&size=100")
    assert status == 200, listing
    assert listing["complete"], listing
    values = {}
    for row in listing["keys"]:
        status, body, _ = get(f"{base(worker)}/weir/tables/{table}/{urllib.parse.quote(str(row['key']), safe='')}/?format=json")
        assert status == 200, body
        values[str(row["key"])] = body["value"]
    return values


def total(worker: Any, table: str) -> int:
    status, body, _ = get(f"{base(worker)}/weir/tables/{table}/?format=json")
    assert status == 200, body
    return int(body["total"])


def aggregates(pipeline: Pipeline) -> list[dict[str, Any]]:
    return [orjson.loads(record.value) for record in asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates")))]


def live(pipeline: Pipeline, table: str) -> dict[str, Any]:
    return {str(key): value for key, value in last_values(pipeline, table).items() if value is not None}


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_deleted_state_directory_is_restored_from_the_changelogs_key_by_key(pipeline: Pipeline, guarantee: str) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))
    env = {"WEIR_AGGREGATE_TIMEOUT_MS": 600_000, "WEIR_GUARANTEE": guarantee}
    worker = pipeline.start_worker("aggregator", **env)
    worker.wait_ready()
    deadline_ms = int(time.time() * 1000) + 600_000
    # every group opened with two of its three parts: open groups with state; one group completes (a done mark)
    records = [(group, {"kind": "open", "correlation_id": group, "total": PARTS, "deadline_ms": deadline_ms}) for group in GROUPS]
    records += [item(group, index) for group in GROUPS for index in (0, 1)]
    records.append(item(GROUPS[0], 2))
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), records))
    wait_for(lambda: total(worker, "aggregates") == len(GROUPS) - 1, timeout_s=60, what="every open group is in table aggregates")
    time.sleep(1.0)  # the last commit is through (the changelogs are read read_committed)
    before = {table: live(pipeline, table) for table in ("aggregates", "aggregates_done")}
    assert len(before["aggregates"]) == len(GROUPS) - 1
    assert list(before["aggregates_done"]) == [GROUPS[0]]

    worker.stop()
    data_dir = pipeline.tmp / f"data-{worker.log_path.stem}"
    assert any(data_dir.rglob("*.sst")) or any(data_dir.rglob("CURRENT")), f"no RocksDB files under {data_dir}: nothing to lose"
    shutil.rmtree(data_dir)
    worker.start()
    worker.wait_ready()

    for table, expected in before.items():
        count = len(expected)
        wait_for(lambda table=table, count=count: total(worker, table) == count, timeout_s=60, what=f"{table} restored")
        restored = table_by_view(worker, table)
        assert restored == live(pipeline, table), f"{table}: restored != its changelog"
        assert restored == expected, f"{table}: changed by the restart"

    # the work goes on from the restored state: each open group completes with its three parts, once
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [item(group, 2) for group in GROUPS[1:]]))
    wait_for(lambda: len(aggregates(pipeline)) >= len(GROUPS), timeout_s=60, what="every group's result")
    time.sleep(2.0)  # a second result would come now
    results = aggregates(pipeline)
    per_group = Counter(result["correlation_id"] for result in results)
    assert per_group == Counter(dict.fromkeys(GROUPS, 1)), per_group
    assert {result["status"] for result in results} == {"complete"}
    assert all(len(result["items"]) == PARTS for result in results)
