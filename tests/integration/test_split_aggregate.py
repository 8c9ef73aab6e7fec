"""Split/aggregate end to end: real broker, real `faust worker` processes, outputs read read_committed."""

from __future__ import annotations

import asyncio
import random
import re
import socket
import threading
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from weir.app.engine.restore import RestorePlan
from weir.app.kafka_io import ensure_topics, produce, produce_json, read_to_end, read_topic
from weir.app.processes import WorkerProcess

pytestmark = pytest.mark.integration

TOPICS = ("orders", "items", "item-results", "aggregates", "dead-letters")


def make_orders(count: int, *, seed: int, max_items: int = 20, sleep_s: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    orders = {}
    for number in range(count):
        size = rng.randint(1, max_items)
        orders[f"order-{number}"] = [{"value": f"{number}/{index}", "sleep_s": sleep_s} for index in range(size)]
    return orders


#: partitions of every topic of the pipeline (the tables' changelogs have as many: WEIR_PARTITIONS' default)
PARTITIONS = 4


def create_topics(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(name) for name in TOPICS], PARTITIONS))


def send_orders(pipeline: Pipeline, orders: dict[str, list[dict[str, Any]]]) -> None:
    records = [(order_id, {"order_id": order_id, "items": items}) for order_id, items in orders.items()]
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("orders"), records))


def read_json(pipeline: Pipeline, topic: str, *, expected: int, timeout_s: float, settle_s: float = 0.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` once ``expected`` are there (then ``settle_s`` more to catch duplicates)."""
    records = asyncio.run(
        read_topic(
            pipeline.bootstrap, pipeline.topic(topic), until=lambda rows: len(rows) >= expected, timeout_s=timeout_s, decode=orjson.loads
        )
    )
    if settle_s:
        time.sleep(settle_s)
        records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(topic), decode=orjson.loads))
    return records


def wait_per_partition(pipeline: Pipeline, topic: str, *, at_least: int, timeout_s: float) -> None:
    """Wait until every partition of ``topic`` holds ``at_least`` committed records."""
    counts: Counter[int] = Counter()

    def enough(records: list[Any]) -> bool:
        counts.clear()
        counts.update(record.partition for record in records)
        return enough_now(counts, at_least)

    asyncio.run(read_topic(pipeline.bootstrap, pipeline.topic(topic), until=enough, timeout_s=timeout_s))
    assert enough_now(counts, at_least), f"{topic}: records per partition {dict(counts)}"


def enough_now(counts: Counter[int], at_least: int) -> bool:
    return len(counts) == PARTITIONS and min(counts.values()) >= at_least


def assert_complete_once(results: list[dict[str, Any]], orders: dict[str, list[dict[str, Any]]]) -> None:
    counts = Counter(result["correlation_id"] for result in results)
    duplicated = {order_id: count for order_id, count in counts.items() if count > 1}
    missing = sorted(set(orders) - set(counts))
    assert not duplicated, f"orders completed more than once: {dict(list(duplicated.items())[:10])}"
    assert not missing, f"{len(missing)} orders never completed, e.g. {missing[:10]}"
    for result in results:
        items = orders[result["correlation_id"]]
        assert result["status"] == "complete", result
        assert [item["status"] for item in result["items"]] == ["ok"] * len(items)
        assert [item["result"]["value"] for item in result["items"]] == [item["value"] for item in items]


def test_thousand_orders_complete_once_across_two_item_workers(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    orders = make_orders(1000, seed=7)
    workers = [pipeline.start_worker("splitter,aggregator"), pipeline.start_worker("items"), pipeline.start_worker("items")]
    for worker in workers:
        worker.wait_ready()
    send_orders(pipeline, orders)
    results = read_json(pipeline, "aggregates", expected=len(orders), timeout_s=240, settle_s=2)
    assert_complete_once(results, orders)
    pids = {item["result"]["pid"] for result in results for item in result["items"]}
    assert len(pids) == 2, f"items should have been processed by both item workers, saw pids {pids}"


def test_items_of_one_order_are_processed_in_parallel(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    orders = {"slow-order": [{"value": index, "sleep_s": 1.0} for index in range(10)]}
    workers = [pipeline.start_worker("splitter,aggregator"), pipeline.start_worker("items"), pipeline.start_worker("items")]
    for worker in workers:
        worker.wait_ready()
    send_orders(pipeline, orders)
    [result] = read_json(pipeline, "aggregates", expected=1, timeout_s=60)
    windows = [(item["result"]["started"], item["result"]["finished"]) for item in result["items"]]
    assert all(finished - started >= 1.0 for started, finished in windows)
    # The most items whose processing windows overlap at one instant: 1 would mean sequential processing.
    most_at_once = max(sum(1 for start, end in windows if start <= instant < end) for instant, _ in windows)
    # The defaults (one chunk of 10, WEIR_ITEM_CONCURRENCY 100): all ten at once, about 1 s in all (seed 003).
    assert most_at_once == 10, f"item windows do not all overlap (at most {most_at_once} at once): {windows}"
    span = max(end for _, end in windows) - min(start for start, _ in windows)
    assert span < 5.0, f"10 one-second items took {span:.1f}s of processing span"


def test_group_with_a_lost_item_completes_partial_at_its_deadline(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    worker = pipeline.start_worker("all")
    worker.wait_ready()
    deadline_ms = int(time.time() * 1000) + 3000
    opened = {"kind": "open", "correlation_id": "gappy", "total": 3, "deadline_ms": deadline_ms}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [("gappy", opened)]))
    # Items 0 and 2 reach the item workers; item 1 is lost on the way.
    items = [("gappy#0", {"correlation_id": "gappy", "index": 0, "total": 3, "payload": {"value": "a"}})]
    items.append(("gappy#2", {"correlation_id": "gappy", "index": 2, "total": 3, "last": True, "payload": {"value": "c"}}))
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("items"), items))
    [result] = read_json(pipeline, "aggregates", expected=1, timeout_s=30)
    assert result["status"] == "partial"
    assert result["reason"] == "timeout"
    assert result["missing"] == [1]
    assert [item["status"] for item in result["items"]] == ["ok", "missing", "ok"]
    assert result["deadline_ms"] == deadline_ms
    assert 0 <= result["completed_ms"] - deadline_ms < 1000, "the timeout must fire within 1 s after the deadline"


def test_poisoned_item_is_retried_dead_lettered_and_reported(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    worker = pipeline.start_worker("all", WEIR_RETRY_ATTEMPTS=3)
    worker.wait_ready()
    orders = {"with-poison": [{"value": "fine"}, {"value": "bad", "poison": True}, {"value": "also fine"}]}
    send_orders(pipeline, orders)
    [result] = read_json(pipeline, "aggregates", expected=1, timeout_s=30)
    assert result["status"] == "complete"
    assert [item["status"] for item in result["items"]] == ["ok", "failed", "ok"]
    assert result["failed"] == [1]
    assert "poisoned item 'bad'" in result["items"][1]["error"]
    [letter] = read_json(pipeline, "dead-letters", expected=1, timeout_s=10)
    assert (letter["reason"], letter["agent"], letter["step"], letter["attempts"]) == ("failed", "items", "process", 3)
    assert letter["origin"]["topic"] == pipeline.topic("items")
    original = orjson.loads(letter["value"]["text"])
    assert (original["correlation_id"], original["index"]) == ("with-poison", 1)


def test_malformed_input_is_dead_lettered_and_the_rest_completes(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    worker = pipeline.start_worker("all")
    worker.wait_ready()
    bad_records: list[tuple[bytes | None, bytes | None]] = [
        (b"broken", b'{"order_id": "x", "items": ['),
        (b"not-utf8", b"\xff\xfe\x00garbage"),
        (b"array", b"[1, 2, 3]"),
        (b"no-items", b'{"order_id": "no-items"}'),
        (b"wrong-type", b'{"order_id": 17, "items": [{"value": 1}]}'),
        (b"empty", b'{"order_id": "empty", "items": []}'),
        (b"tombstone", None),
    ]
    good = make_orders(20, seed=3, max_items=5)
    asyncio.run(produce(pipeline.bootstrap, pipeline.topic("orders"), bad_records))
    send_orders(pipeline, good)
    # A malformed item message straight onto the items topic, and one to the aggregator.
    asyncio.run(produce(pipeline.bootstrap, pipeline.topic("items"), [(b"k", b'{"correlation_id": "z", "index": -1}')]))
    asyncio.run(produce(pipeline.bootstrap, pipeline.topic("item-results"), [(b"k", b'{"kind": "item", "correlation_id": "z"}')]))
    results = read_json(pipeline, "aggregates", expected=len(good) + len(bad_records), timeout_s=60)
    # Every order gets its one result: a bad one (each has a record key here) an 'invalid' one with its reason.
    invalid = {result["correlation_id"]: result for result in results if result["status"] == "invalid"}
    assert set(invalid) == {key.decode() for key, _ in bad_records if key is not None}
    assert {key: result["reason"] for key, result in invalid.items()} == {
        "broken": "undecodable",
        "not-utf8": "undecodable",
        "array": "invalid",
        "no-items": "invalid",
        "wrong-type": "invalid",
        "empty": "invalid",
        "tombstone": "undecodable",
    }
    assert_complete_once([result for result in results if result["status"] != "invalid"], good)
    letters = read_json(pipeline, "dead-letters", expected=len(bad_records) + 2, timeout_s=20)
    by_key = {(letter["key"]["text"] or letter["key"]["base64"]): letter for letter in letters}
    assert len(letters) == len(bad_records) + 2
    assert by_key["broken"]["reason"] == "undecodable"
    assert "not valid JSON" in by_key["broken"]["error"]
    assert by_key["not-utf8"]["reason"] == "undecodable"
    assert by_key["not-utf8"]["value"]["base64"]
    assert by_key["array"]["reason"] == "invalid"
    assert "JSON object" in by_key["array"]["error"]
    assert by_key["no-items"]["reason"] == "invalid"
    assert "'items'" in by_key["no-items"]["error"]
    assert by_key["wrong-type"]["reason"] == "invalid"
    assert "'order_id'" in by_key["wrong-type"]["error"]
    assert by_key["empty"]["reason"] == "invalid"
    assert by_key["tombstone"]["reason"] == "undecodable"
    assert "tombstone" in by_key["tombstone"]["error"]
    assert {letter["agent"] for letter in letters} == {"splitter", "items", "aggregator"}


def kill_one_of_two_mid_run(
    pipeline: Pipeline, agents: str, settings: dict[str, Any], orders: dict[str, list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], int]:
    """Two workers of ``agents``; the second is SIGKILLed once 60 results are out and each worker has committed groups
    of its own (it holds partitions mid-stream, and its changelog partitions have records a standby could copy).

    Returns every result read_committed once all orders have one (3 s more to catch duplicates), and how many
    there were at the kill.
    """
    first = pipeline.start_worker(agents, **settings)
    second = pipeline.start_worker(agents, **settings)
    first.wait_ready()
    second.wait_ready()
    # The orders come over about 6 s, as a flow, not all at once: all at once, the items of the worker that split
    # its orders first queued before the other's, and most groups of one worker completed before any of the other's.
    # On a loaded machine, a kill after 60 results could then find the victim with next to nothing committed (a
    # takeover with nothing to restore), or, waiting for its groups, come when almost every order was done.
    batches = [dict(list(orders.items())[start : start + 25]) for start in range(0, len(orders), 25)]
    sender = threading.Thread(target=send_paced, args=(pipeline, batches, 0.5))
    sender.start()
    try:
        # Each worker owns two of the four partitions, and a result goes to its order's partition: results in every
        # partition are groups each worker completed and committed.
        wait_per_partition(pipeline, "aggregates", at_least=5, timeout_s=120)
        partial = read_json(pipeline, "aggregates", expected=60, timeout_s=120)
        assert len(partial) >= 60
        second.kill()
    finally:
        sender.join()
    return read_json(pipeline, "aggregates", expected=len(orders), timeout_s=240, settle_s=3), len(partial)


def send_paced(pipeline: Pipeline, batches: list[dict[str, list[dict[str, Any]]]], every_s: float) -> None:
    """Send each batch of orders ``every_s`` after the one before."""
    for batch in batches:
        started = time.monotonic()
        send_orders(pipeline, batch)
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))


@pytest.mark.parametrize(
    ("guarantee", "transactions"),
    [("exactly_once", "per_worker"), ("exactly_once", "per_partition"), ("at_least_once", "per_worker")],
)
def test_sigkill_of_a_worker_mid_run_loses_nothing(pipeline: Pipeline, guarantee: str, transactions: str) -> None:
    """Two workers run every agent; one is SIGKILLed while orders flow. Under exactly_once (one transaction
    per worker, the default, or one per source partition) no order's result is visible twice to a
    read_committed consumer; under at_least_once none is lost (duplicates of a result are allowed there
    and counted)."""
    create_topics(pipeline)
    orders = make_orders(300, seed=11, max_items=10, sleep_s=0.01)
    # A long group timeout: the takeover (session timeout, rebalance, changelog restore) must not turn a
    # slow order into a partial one; this test is about loss and duplication.
    # One item at a time per worker: about 8 s of item work each, so that the kill comes mid-run (with the items at
    # once in a pool, a loaded machine's slow calls moving them there, every order could be done before it).
    settings = {
        "WEIR_GUARANTEE": guarantee,
        "WEIR_TRANSACTIONS": transactions,
        "WEIR_AGGREGATE_TIMEOUT_MS": 180_000,
        "WEIR_ITEM_CONCURRENCY": 1,
    }
    results, before_kill = kill_one_of_two_mid_run(pipeline, "all", settings, orders)
    assert before_kill < len(orders) - 100, f"{before_kill} results before the kill: not mid-run"
    if guarantee == "exactly_once":
        assert_complete_once(results, orders)
        assert_committed_once_below_the_results(pipeline, orders)
        # no standby replicas (the default): the survivor read the taken-over changelogs from their beginning, and
        # those of the partitions it kept from where its own commits had left them
        takeover = restores(pipeline.workers[0])[-1]
        assert takeover.from_beginning > 0, takeover
        assert takeover.standby == 0, takeover
        assert takeover.resumed > 0, f"the partitions the survivor kept were read from their beginning again: {takeover}"
    else:
        unique = {result["correlation_id"]: result for result in results}
        assert_complete_once(list(unique.values()), orders)


def restores(worker: WorkerProcess) -> list[RestorePlan]:
    """What each restore of ``worker``'s tables read, from its log (``app.engine.restore``), oldest first."""
    pattern = r"tables restored in [\d.]+ s: (\d+) changelog records in (\d+) partitions, (\d+) resumed from a local copy \((\d+) a"
    return [RestorePlan(*map(int, figures)) for figures in re.findall(pattern, worker.log_text())]


def test_a_standby_replica_takes_over_from_its_copy_and_loses_nothing(pipeline: Pipeline) -> None:
    """WEIR_STANDBY_REPLICAS=1: each worker of two keeps a copy of the other's table partitions, read from their
    changelogs as they are written. One is SIGKILLed mid-run; the survivor's takeover resumes each copy where it had
    got to and reads only the rest (the same test without standbys reads them from their beginning, above), and
    every order completes once."""
    create_topics(pipeline)
    orders = make_orders(300, seed=14, max_items=10, sleep_s=0.01)
    settings = {"WEIR_STANDBY_REPLICAS": 1, "WEIR_AGGREGATE_TIMEOUT_MS": 180_000, "WEIR_ITEM_CONCURRENCY": 1}
    results, before_kill = kill_one_of_two_mid_run(pipeline, "all", settings, orders)
    assert before_kill < len(orders) - 100, f"{before_kill} results before the kill: not mid-run"
    assert_complete_once(results, orders)
    assert_committed_once_below_the_results(pipeline, orders)
    survivor = pipeline.workers[0]
    assert "Starting standby partitions" in survivor.log_text(), "the survivor kept standby copies"
    takeover = restores(survivor)[-1]
    assert takeover.standby > 0, f"the takeover resumed no standby's copy: {takeover}"


def test_items_inline_sigkill_of_a_worker_mid_run_loses_nothing(pipeline: Pipeline) -> None:
    """WEIR_ITEMS_INLINE: two splitter workers run the item step and send each order's result themselves; one is
    SIGKILLed while orders flow. Every order's result is visible once to a read_committed consumer, and
    nothing went through the items or item-results topics."""
    create_topics(pipeline)
    # Items of 10 ms, one at a time: about 7 s of work per worker, so that the kill (at 60 results) comes mid-run.
    orders = make_orders(250, seed=12, max_items=10, sleep_s=0.01)
    settings = {"WEIR_ITEMS_INLINE": "1", "WEIR_ITEM_CONCURRENCY": 1}
    results, before_kill = kill_one_of_two_mid_run(pipeline, "splitter", settings, orders)
    assert before_kill < len(orders) - 100, f"{before_kill} results before the kill: not mid-run"
    assert_complete_once(results, orders)
    for topic in ("items", "item-results"):
        rows = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(topic)))
        assert rows == [], f"{len(rows)} records on {topic}: the items ran inline"


def assert_committed_once_below_the_results(pipeline: Pipeline, orders: dict[str, list[dict[str, Any]]]) -> None:
    """Every item message, and every item's outcome, is committed once (read_committed).

    The aggregator drops a repeated outcome by its index, so a replayed item message (its outcome committed by
    a worker killed before it committed the message's offset) never shows in the results. Here it would: with
    the items agent's 8 actors of sessions 1-9 this failed in most runs. Item messages and outcomes come plain
    and in bundles.
    """

    def committed(topic: str) -> list[dict[str, Any]]:
        rows = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(topic)))
        return [orjson.loads(row.value) for row in rows if row.value is not None]

    def unbundled(topic: str) -> list[dict[str, Any]]:
        records = committed(topic)
        bundles = [record for record in records if record.get("kind") == "bundle"]
        assert bundles, f"no bundle was sent to {topic}: the check covers only plain messages there"
        return [record for record in records if record.get("kind") != "bundle"] + [m for bundle in bundles for m in bundle["messages"]]

    chunks = Counter((chunk["correlation_id"], chunk["items"][0]["index"]) for chunk in unbundled("items"))
    outcomes: Counter[tuple[str, int]] = Counter()
    runs: dict[tuple[str, int], list[Any]] = {}  # who ran each outcome, and when: (pid, started)
    for message in unbundled("item-results"):
        kind = message.get("kind")
        for item in [message] if kind == "item" else message.get("items", []) if kind == "items" else []:
            key = (message["correlation_id"], item["index"])
            outcomes[key] += 1
            result = item.get("result") or {}
            runs.setdefault(key, []).append((result.get("pid"), round(result.get("started", 0), 3)))
    expected = {(order_id, index) for order_id, items in orders.items() for index in range(len(items))}
    missing, unexpected = len(expected - set(outcomes)), len(set(outcomes) - expected)
    assert set(outcomes) == expected, f"{missing} item outcomes missing, {unexpected} unexpected"
    twice = {key: count for key, count in outcomes.items() if count > 1}
    shown = {key: runs[key] for key in list(twice)[:6]}
    assert not twice, f"{len(twice)} item outcomes committed more than once, e.g. (pid, started) of each run: {shown}"
    sent_twice = {key: count for key, count in chunks.items() if count > 1}
    assert not sent_twice, f"{len(sent_twice)} item messages committed more than once, e.g. {list(sent_twice)[:6]}"


def read_changelog(pipeline: Pipeline, table: str, key: str) -> list[Any]:
    """The values a table's changelog (its durable contents) holds for ``key``, oldest first."""
    records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic(f"{table}-changelog")))
    return [None if record.value is None else orjson.loads(record.value) for record in records if orjson.loads(record.key) == key]


def test_late_items_are_counted_by_index_and_never_merged(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    worker = pipeline.start_worker("all")
    worker.wait_ready()
    deadline_ms = int(time.time() * 1000) + 2000
    opened = {"kind": "open", "correlation_id": "slowpoke", "total": 2, "deadline_ms": deadline_ms}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [("slowpoke", opened)]))
    [result] = read_json(pipeline, "aggregates", expected=1, timeout_s=30)
    assert (result["status"], result["missing"]) == ("partial", [0, 1])
    late = [
        (f"slowpoke#{index}", {"correlation_id": "slowpoke", "index": index, "total": 2, "payload": {"value": index}})
        for index in (1, 1, 0)
    ]
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("items"), late))
    deadline = time.monotonic() + 30
    done: list[Any] = []
    while time.monotonic() < deadline:
        done = read_changelog(pipeline, "aggregates_done", "slowpoke")
        if done and done[-1]["late_indexes"] == [0, 1]:
            break
    assert done, "the completed group is not in table aggregates_done"
    assert done[-1]["late_indexes"] == [0, 1], f"late items are counted once by index: {done[-1]}"
    assert len(read_json(pipeline, "aggregates", expected=2, timeout_s=3)) == 1, "a late item must not complete the group again"


def transactional_ids(worker: WorkerProcess) -> set[str]:
    return set(re.findall(r"transactions run under transactional id (\S+)", worker.log_text()))


def test_a_deadline_survives_a_worker_crash(pipeline: Pipeline) -> None:
    """The deadline lives in the table: a group whose deadline passes while its worker is down
    completes as soon as the partition has an owner again."""
    create_topics(pipeline)
    worker = pipeline.start_worker("all")
    worker.wait_ready()
    deadline_ms = int(time.time() * 1000) + 6000
    opened = {"kind": "open", "correlation_id": "orphan", "total": 2, "deadline_ms": deadline_ms}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("item-results"), [("orphan", opened)]))
    item = {"correlation_id": "orphan", "index": 0, "total": 2, "payload": {"value": "kept"}}
    asyncio.run(produce_json(pipeline.bootstrap, pipeline.topic("items"), [("orphan#0", item)]))
    # Wait until the group state is durable (in the committed changelog), then crash.
    until = time.monotonic() + 20
    while time.monotonic() < until and not any(value and value["received"] for value in read_changelog(pipeline, "aggregates", "orphan")):
        time.sleep(0.2)
    worker.kill()
    assert not read_json(pipeline, "aggregates", expected=1, timeout_s=1), "completed before the crash: the test proves nothing"
    time.sleep(max(0.0, deadline_ms / 1000 - time.time()) + 1)
    restarted = pipeline.start_worker("all", web_port=worker.web_port)
    restarted.wait_ready()
    [result] = read_json(pipeline, "aggregates", expected=1, timeout_s=30)
    # Restarted on its port, it ran under its predecessor's transactional id (and so ended its open transaction).
    [before] = transactional_ids(worker)
    assert before.endswith(f"-worker-{socket.gethostname()}-{worker.web_port}"), before
    assert transactional_ids(restarted) == {before}
    assert (result["status"], result["reason"], result["missing"]) == ("partial", "timeout", [1])
    assert result["items"][0] == {"index": 0, "status": "ok", "result": result["items"][0]["result"]}
    assert result["items"][0]["result"]["value"] == "kept"
    assert result["completed_ms"] > deadline_ms
