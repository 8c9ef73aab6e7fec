"""Garbage on every input topic of every agent set: each message is dead-lettered with a reason (or, valid by chance,
processed), no worker crashes, and each still processes a valid message afterwards.

The garbage is generated with hypothesis strategies, collected by a ``@given`` function run once with
``derandomize=True`` (the same values every run, no example database), plus hand-written nasty cases.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from examples.eof_orders import JOB_SETTING as EOF_ORDERS_JOB
from shop.demo import ENTRY as SHOP_ENTRY
from shop.demo import WORKER_ENV as SHOP_WORKER_ENV
from shop.demo import run_shop
from shop.state import SHOP_INPUTS
from tests.integration.conftest import Pipeline
from weir.app.eof_gateway import Gateway
from weir.app.kafka_io import ensure_topics, produce_json, read_to_end, read_topic
from weir.tables.triggers import completion_message, publish_trigger_messages, registration_message

#: the shop's and the chaos run's workers load the 2 cores: these modules run one after another in one pytest process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shop")]

#: Hypothesis-generated messages per input topic (hand-written cases come on top).
GENERATED_PER_TOPIC = 40
MAX_MESSAGE_BYTES = 100_000
ACCEPTED_REASONS = {"undecodable", "invalid", "rejected", "failed"}

SHOP_LINE = '{"order_id": "o-1", "card": "4111111111111111", "items": [{"flavour": "vanilla", "size": "large"}]}'
#: A message of the right shape per input topic: the garbage is built around it (missing keys, wrong types, ...).
TEMPLATES: dict[str, dict[str, Any]] = {
    "orders": {"order_id": "o-1", "items": [{"value": 1}]},
    "items": {"correlation_id": "o-1", "index": 0, "total": 1, "last": True, "payload": {"value": 1}},
    "item-results": {
        "kind": "item",
        "correlation_id": "o-1",
        "index": 0,
        "total": 1,
        "last": True,
        "ok": True,
        "result": {},
        "error": None,
        "attempts": 1,
    },
    "eof-batches": {
        "client": "c-1",
        "batch_id": 0,
        "lines": ['{"order_id": "a", "time": "12:00", "items": [{"flavour": "vanilla", "scoops": 1}]}'],
    },
    "eof-counter": {"kind": "sent", "client": "c-1", "batches": 1},
    "eof-aggregate": {
        "kind": "batch",
        "client": "c-1",
        "batch_id": 0,
        "records": [{"order_id": "a", "time": "12:00", "items": [["vanilla", 1]]}],
    },
    "eof-join": {
        "kind": "totals",
        "client": "c-1",
        "batches": 1,
        "records": 1,
        "totals": {"orders": 1, "scoops": {"vanilla": 1}},
        "error": None,
    },
    "shop.orders": {"ticket": "d/s/1", "screen": "d/s", "line": 1, "text": SHOP_LINE},
    "shop.payments": {
        "kind": "capture",
        "order_id": "d/s/1",
        "amount_cents": 500,
        "decision_key": "s/1/o-1",
        "card": {"token": "tok_abc", "last4": "1111", "luhn_ok": True},
    },
    "shop.kitchen": {"kind": "reserve", "order_id": "d/s/1", "flavour": "vanilla", "scoops": 3},
    "shop.dispatch": {
        "kind": "open",
        "order_id": "d/s/1",
        "ticket": "d/s/1",
        "screen": "d/s",
        "line": 1,
        "order": {"order_id": "o-1", "scoops": {"vanilla": 3}, "amount_cents": 750},
        "deadline_ms": 0,
    },
    "shop.payment-answers": {"kind": "payment", "order_id": "d/s/1", "ok": True, "reason": None},
    "shop.kitchen-answers": {"kind": "kitchen", "order_id": "d/s/1", "flavour": "vanilla", "ok": True, "reason": None},
    "shop.claims": {
        "kind": "order",
        "screen": "d/s",
        "ticket": "d/s/1",
        "line": 1,
        "order": {
            "order_id": "o-1",
            "card": {"token": "tok_abc", "last4": "1111", "luhn_ok": True},
            "scoops": {"vanilla": 1},
            "amount_cents": 250,
        },
    },
    "triggers": {"kind": "completion", "parent_id": "p-1", "child_id": "c-1", "outcome": "ok"},
}
#: The shop's stages, its end of day's (the end-of-stream agents with the shop's job) included.
SHOP_SET = "shop_orders,shop_claims,shop_payments,shop_kitchen,flows,eof_controller,eof_aggregator,eof_joiner"
#: Each agent set (one worker each) and the input topics its agents read.
AGENT_SETS: dict[str, tuple[str, ...]] = {
    "all": ("orders", "items", "item-results"),
    "eof_filter,eof_controller,eof_aggregator,eof_joiner": ("eof-batches", "eof-counter", "eof-aggregate", "eof-join"),
    SHOP_SET: (*(f"shop.{name}" for name in SHOP_INPUTS), "eof-counter", "eof-aggregate", "eof-join"),
    "triggers": ("triggers",),
}
#: What a set's worker needs besides: the end-of-stream agents' job; the shop's flows and end of day for the shop's.
SET_ENV: dict[str, dict[str, str]] = {
    "eof_filter,eof_controller,eof_aggregator,eof_joiner": {"WEIR_EOF_JOB": EOF_ORDERS_JOB},
    SHOP_SET: SHOP_WORKER_ENV,
}
#: The entry module of a set's worker (the shop's stages are agent sets the shop registers).
SET_ENTRY: dict[str, str] = {SHOP_SET: SHOP_ENTRY}

ODD_TEXT = [
    "\u0000",
    "\ufeff",
    "\u202eevil",
    "e\u0301\u0301\u0301",
    "\U0001d518\U0001d52b\U0001d526",
    "\uffff",
    "👩‍👩‍👧‍👦",
    "a" * 10 + "\u200b" * 10,
    "\x1b[31m",
    "</script>",
]
HUGE = [10**30, -(10**30), 2**63, 1e308, -1e-308, "x" * 50_000, [0] * 5_000, {"k": "v" * 20_000}]
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(ODD_TEXT),
    st.sampled_from(HUGE),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
KEYS = st.one_of(st.none(), st.binary(max_size=24), st.text(max_size=24).map(str.encode))


def _garbage(template: dict[str, Any]) -> st.SearchStrategy[tuple[bytes | None, bytes | None]]:
    fields = sorted(template)
    encoded = json.dumps(template).encode()
    random_bytes = st.binary(max_size=300)
    broken_json = st.integers(min_value=1, max_value=len(encoded) - 1).map(lambda cut: encoded[:cut])
    spliced = st.tuples(st.integers(min_value=0, max_value=len(encoded)), st.binary(min_size=1, max_size=4)).map(
        lambda spot: encoded[: spot[0]] + spot[1] + encoded[spot[0] :]
    )
    missing_keys = st.sets(st.sampled_from(fields), min_size=1).map(lambda gone: {k: v for k, v in template.items() if k not in gone})
    wrong_types = st.dictionaries(st.sampled_from(fields), WRONG_VALUES, min_size=1).map(lambda wrong: {**template, **wrong})
    as_json = st.one_of(missing_keys, wrong_types, ANY_JSON).map(lambda value: json.dumps(value).encode())
    return st.tuples(KEYS, st.one_of(random_bytes, broken_json, spliced, as_json))


def generated_garbage(template: dict[str, Any], count: int) -> list[tuple[bytes | None, bytes | None]]:
    collected: list[tuple[bytes | None, bytes | None]] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(_garbage(template))
    def collect(message: tuple[bytes | None, bytes | None]) -> None:
        collected.append(message)

    collect()
    return collected


def nasty_cases(template: dict[str, Any]) -> list[tuple[bytes | None, bytes | None]]:
    valid = json.dumps(template).encode()
    return [
        (b"k", None),  # a tombstone (Kafka refuses a record with neither key nor value)
        (None, valid.replace(b'"', b"'")),
        (b"k", b""),
        (b"k", b"null"),
        (b"k", b"[]"),
        (b"k", b'"just a string"'),
        (b"k", b"1e999"),
        (b"k", b"NaN"),
        (b"k", b"\xff\xfe\x00garbage"),
        (b"k", b"\xef\xbb\xbf" + valid),  # a byte-order mark first
        (b"k", b'{"kind": "\\ud800"}'),  # a lone surrogate
        (b"k", b"[" * 5_000 + b"]" * 5_000),
        (b"k", b'{"a": 1, "a": 2}'),
        (b"k", b'{"order_id": ' + b'"' + b"z" * (MAX_MESSAGE_BYTES + 10) + b'"}'),  # over WEIR_MAX_MESSAGE_BYTES
        (b"\xff" * 300, valid[: len(valid) // 2]),
    ]


async def send_all(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes | None]]) -> list[tuple[int, int]]:
    """Send raw messages; their (partition, offset)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, max_request_size=2_000_000)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=key, value=value) for key, value in messages]
        return [(metadata.partition, metadata.offset) for metadata in await asyncio.gather(*futures)]
    finally:
        await producer.stop()


def read_trace(trace: Path) -> tuple[set[tuple[str, int, int]], dict[tuple[str, int], int]]:
    """The (topic, partition, offset) of every event the worker handled, and its last committed offset per partition."""
    handled: set[tuple[str, int, int]] = set()
    committed: dict[tuple[str, int], int] = {}
    if trace.exists():
        for line in trace.read_text().splitlines():
            _, _, what, topic, partition, offset = line.split()
            if what == "event":
                handled.add((topic, int(partition), int(offset)))
            elif what == "commit":
                committed[(topic, int(partition))] = max(committed.get((topic, int(partition)), -1), int(offset))
    return handled, committed


def wait_until_committed(trace: Path, positions: list[tuple[str, int, int]], timeout_s: float) -> None:
    """Until every position is handled and its offset committed (under exactly_once, with all it produced)."""
    deadline = time.monotonic() + timeout_s
    while True:
        handled, committed = read_trace(trace)
        pending = [p for p in positions if p not in handled or committed.get((p[0], p[1]), -1) <= p[2]]
        if not pending:
            return
        if time.monotonic() > deadline:
            message = f"{len(pending)} of {len(positions)} messages not handled and committed after {timeout_s}s, e.g. {pending[:3]}"
            raise AssertionError(message)
        time.sleep(0.5)


# ---------------------------------------------------------------- a valid message afterwards, per agent set


def _check_split_aggregate(pipeline: Pipeline) -> None:
    order = {"order_id": "o-after", "items": [{"value": 1}, {"value": 2}]}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), [("o-after", order)]))
    results = asyncio.run(
        read_topic(
            pipeline.bootstrap,
            pipeline.topic("aggregates"),
            until=lambda rows: any(row["correlation_id"] == "o-after" for row in rows),
            timeout_s=90,
            decode=orjson.loads,
        )
    )
    assert [row["status"] for row in results if row["correlation_id"] == "o-after"] == ["complete"]


def _check_eof(pipeline: Pipeline) -> None:
    lines = [json.dumps({"order_id": f"e-{n}", "time": "12:00", "items": [{"flavour": "vanilla", "scoops": 1}]}) for n in range(5)]

    async def run() -> dict[str, Any]:
        async with Gateway(pipeline.bootstrap, pipeline.topic) as gateway:
            return await gateway.run_client("after-garbage", lines, batch_size=2, timeout_s=90)

    report = asyncio.run(run())
    assert report["client"] == "after-garbage"
    assert report["status"] != "abandoned", report


def _check_shop(pipeline: Pipeline) -> None:
    result = asyncio.run(
        run_shop(
            {"after": [SHOP_LINE, SHOP_LINE.replace("o-1", "o-2")]},
            bootstrap=pipeline.bootstrap,
            topic_prefix=pipeline.prefix,
            timeout_s=90,
        )
    )
    assert result["reports"]["after"]["lines"] == 2
    assert result["reports"]["after"]["served"] + result["reports"]["after"]["aborted"] == 2


def _check_triggers(pipeline: Pipeline) -> None:
    messages = [registration_message("after-parent", 1, wake_topic="woken"), completion_message("after-parent", "child-0")]
    asyncio.run(publish_trigger_messages(pipeline.bootstrap, pipeline.prefix, messages))
    woken = asyncio.run(
        read_topic(pipeline.bootstrap, pipeline.topic("woken"), until=lambda rows: len(rows) >= 1, timeout_s=90, decode=orjson.loads)
    )
    assert [wake["trigger_id"] for wake in woken] == ["after-parent"]


VALID_AFTERWARDS: dict[str, Callable[[Pipeline], None]] = {
    "all": _check_split_aggregate,
    "eof_filter,eof_controller,eof_aggregator,eof_joiner": _check_eof,
    SHOP_SET: _check_shop,
    "triggers": _check_triggers,
}


@pytest.mark.parametrize("agents", list(AGENT_SETS), ids=["split-aggregate", "eof", "shop", "triggers"])
def test_garbage_on_every_input_topic_is_dead_lettered_and_the_worker_survives(pipeline: Pipeline, agents: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    worker = pipeline.start_worker(
        agents,
        entry=SET_ENTRY.get(agents, "app.main"),
        WEIR_TRACE_FILE=trace,
        WEIR_MAX_MESSAGE_BYTES=MAX_MESSAGE_BYTES,
        WEIR_COMMIT_INTERVAL=0.2,
        **SET_ENV.get(agents, {}),
    )
    worker.wait_ready(120)
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in AGENT_SETS[agents]], 4))
    sent: dict[tuple[str, int, int], tuple[bytes | None, bytes | None]] = {}
    for name in AGENT_SETS[agents]:
        messages = generated_garbage(TEMPLATES[name], GENERATED_PER_TOPIC) + nasty_cases(TEMPLATES[name])
        positions = asyncio.run(send_all(pipeline.bootstrap, pipeline.topic(name), messages))
        sent.update(
            {(pipeline.topic(name), partition, offset): message for (partition, offset), message in zip(positions, messages, strict=True)}
        )

    wait_until_committed(trace, list(sent), timeout_s=180)
    letters = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("dead-letters"), decode=orjson.loads))
    by_origin = {(letter["origin"]["topic"], letter["origin"]["partition"], letter["origin"]["offset"]): letter for letter in letters}
    ours = [by_origin[position] for position in sent if position in by_origin]
    reasons = Counter(letter["reason"] for letter in ours)
    unexpected = [(letter["agent"], letter["error"][:160]) for letter in ours if letter["reason"] not in ACCEPTED_REASONS]
    assert not unexpected, f"garbage that raised an unexpected error instead of being refused: {unexpected[:5]}"
    assert all(letter["error"] for letter in ours), "every dead letter says why"
    processed = len(sent) - len(ours)
    topic_count = len(AGENT_SETS[agents])
    print(
        f"\n{agents}: {len(sent)} bad inputs tried on {topic_count} topics: dead-lettered {dict(reasons)}, processed as valid {processed}"
    )
    # the worker is alive and still does its job
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker died"
    VALID_AFTERWARDS[agents](pipeline)
    assert worker.process.poll() is None
    assert "crashed" not in worker.log_text().lower()
