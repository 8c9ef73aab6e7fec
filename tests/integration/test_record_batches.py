"""A batch's sends go out as record batches (``app.engine.produce``), each at most ``EngineConfig.record_batch_bytes``:
more than one record batch's worth to one partition, from one event and from events in a row, keeps its order and
sends each record once. Real broker, a real `faust worker` running tests/integration/large_flows.py."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.integration.conftest import Pipeline
from tests.integration.large_flows import PAD, PIECES
from tests.integration.test_barrier import send
from weir.app.engine.config import EngineConfig
from weir.app.kafka_io import ensure_topics, read_to_end, read_topic

pytestmark = pytest.mark.integration

INPUTS = 10


def test_outputs_larger_than_a_record_batch_keep_their_order_and_arrive_once(pipeline: Pipeline) -> None:
    """10 inputs, each sent to 20 outputs of 60 KB (1.2 MB per event, 12 MB in all) in one output partition: every
    output once, in input order and each input's in its order; nothing dead-lettered."""
    assert 2 * EngineConfig.record_batch_bytes < PIECES * PAD  # an event's outputs fill more than two record batches
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic("big-in"), pipeline.topic("big-out")], 1))
    send(pipeline, "big-in", [("k", {"n": n}, {}) for n in range(INPUTS)])
    worker = pipeline.start_worker("flows", WEIR_FLOWS="tests.integration.large_flows")
    worker.wait_ready()
    name = pipeline.topic("big-out")
    asyncio.run(read_topic(pipeline.bootstrap, name, until=lambda rows: len(rows) >= INPUTS * PIECES, timeout_s=90))
    rows = asyncio.run(read_to_end(pipeline.bootstrap, name, decode=orjson.loads))
    assert [(row["n"], row["piece"]) for row in rows] == [(n, piece) for n in range(INPUTS) for piece in range(PIECES)]
    assert all(len(row["pad"]) == PAD for row in rows)
    letters = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dead-letters"), decode=orjson.loads))
    assert letters == []
