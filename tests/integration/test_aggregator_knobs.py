"""The aggregator's inactivity timeout and operator forces, on the real broker with real `faust worker` processes.

Opens go straight to the item-results topic and items to the items topic (the splitter's two outputs), so a
test says exactly when each part arrives; results are read read_committed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from weir.app.control import send_force
from weir.app.kafka_io import ensure_topics, produce_json, read_to_end, read_topic
from weir.app.settings import SettingError

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")
#: No absolute deadline: groups end by count, flag, inactivity or force only.
NO_DEADLINE = {"WEIR_AGGREGATE_TIMEOUT_MS": 0}


def create_topics(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], 4))


def send_open(pipeline: Pipeline, correlation_id: str, total: int) -> None:
    opened = {"kind": "open", "correlation_id": correlation_id, "total": total, "deadline_ms": None}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [(correlation_id, opened)]))


def send_item(pipeline: Pipeline, correlation_id: str, index: int, total: int) -> None:
    item = {"correlation_id": correlation_id, "index": index, "total": total, "payload": {"value": index}}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("items"), [(f"{correlation_id}#{index}", item)]))


def results(pipeline: Pipeline, *, expected: int, timeout_s: float) -> list[dict[str, Any]]:
    return asyncio.run(
        read_topic(
            pipeline.bootstrap,
            pipeline.topic("aggregates"),
            until=lambda rows: len(rows) >= expected,
            timeout_s=timeout_s,
            decode=orjson.loads,
        )
    )


def merged(result: dict[str, Any]) -> list[int]:
    return [item["index"] for item in result["items"] if item["status"] == "ok"]


def test_an_inactivity_timeout_keeps_a_group_open_while_parts_come_and_survives_a_restart(pipeline: Pipeline) -> None:
    """Quiet period 20 s, no absolute deadline. Parts 0 and 1 arrive; the worker is stopped and started again
    (its group restored from the changelog); parts 2 and 3 arrive; part 4 never does. One result, reason
    ``inactivity``, one quiet period after the last part, with parts 0 to 3."""
    create_topics(pipeline)
    # more than a stop and a restart of the worker take: 10 s was not on a loaded 2-core CI machine (the
    # restarted worker was ready after the group's quiet period had run out, and rightly closed it with 0 and 1)
    quiet_ms = 20_000
    settings = {**NO_DEADLINE, "WEIR_AGGREGATE_INACTIVITY_MS": quiet_ms}
    worker = pipeline.start_worker("all", **settings)
    worker.wait_ready()
    send_open(pipeline, "quiet", 5)
    send_item(pipeline, "quiet", 0, 5)
    time.sleep(2)
    send_item(pipeline, "quiet", 1, 5)
    part_1_sent = time.monotonic()
    time.sleep(2)
    worker.stop()
    restarted = pipeline.start_worker("all", web_port=worker.web_port, **settings)
    restarted.wait_ready()
    restart_s = time.monotonic() - part_1_sent
    send_item(pipeline, "quiet", 2, 5)
    time.sleep(4)
    send_item(pipeline, "quiet", 3, 5)
    last_sent_ms = int(time.time() * 1000)
    [result] = results(pipeline, expected=1, timeout_s=60)
    assert (result["status"], result["reason"]) == ("partial", "inactivity"), result
    assert merged(result) == [0, 1, 2, 3], f"a part that came within the quiet period was merged ({restart_s:.1f} s to restart)"
    assert result["missing"] == [4]
    assert result["deadline_ms"] is None
    assert quiet_ms <= result["completed_ms"] - last_sent_ms < quiet_ms + 5_000, "closed one quiet period after the last part"


def test_force_complete_of_every_open_group_and_force_discard_of_one(pipeline: Pipeline) -> None:
    """Twenty groups with no timeout at all, each missing parts; a discard of one, then a force-complete sent to
    every partition: each group has exactly one result, the discarded one ``discarded``, the others partial
    with reason ``forced``; a part that comes afterwards changes nothing."""
    create_topics(pipeline)
    worker = pipeline.start_worker("all", **NO_DEADLINE)
    worker.wait_ready()
    groups = [f"g-{number}" for number in range(20)]
    for group in groups:
        send_open(pipeline, group, 3)
        send_item(pipeline, group, 1, 3)
    time.sleep(3)  # the parts are merged; nothing can complete by itself
    # a topic no stage reads is refused, nothing sent: a typo (no such topic; sending would create it), an output topic
    for unread in (pipeline.topic("item-resluts"), pipeline.topic("aggregates")):
        with pytest.raises(SettingError, match=r"no topic|no stage reads"):
            asyncio.run(send_force(pipeline.bootstrap, unread, "complete"))
    assert asyncio.run(send_force(pipeline.bootstrap, pipeline.topic("item-results"), "discard", "g-0")) == 1
    assert asyncio.run(send_force(pipeline.bootstrap, pipeline.topic("item-results"), "complete")) == 4
    found = results(pipeline, expected=len(groups), timeout_s=30)
    send_item(pipeline, "g-5", 0, 3)  # late: counted, never a second result
    time.sleep(3)
    # a second result would be there by now
    found = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("aggregates"), decode=orjson.loads))
    by_group = {result["correlation_id"]: result for result in found}
    assert len(found) == len(groups) == len(by_group), [result["correlation_id"] for result in found]
    assert (by_group["g-0"]["status"], by_group["g-0"]["reason"]) == ("discarded", "forced")
    for group in groups[1:]:
        assert (by_group[group]["status"], by_group[group]["reason"]) == ("partial", "forced"), by_group[group]
        assert merged(by_group[group]) == [1]
        assert by_group[group]["missing"] == [0, 2]
