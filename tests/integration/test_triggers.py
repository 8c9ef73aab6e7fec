"""Counter triggers end to end: real broker, real `faust worker` processes, wakes read read_committed.

What needs the broker: the sweep against a real database within its interval and grace, a SIGKILL of a trigger worker,
a child killed between its commit and its publish, the status rows purged by a worker. The trigger stage's behaviours
(every parent woken once whatever the order, duplicates and early completions; expiry of what never fired) run on the
test driver: tests/unit/triggers/test_trigger_shell.py."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.conftest import Pipeline
from weir.app.kafka_io import ensure_topics, read_to_end, read_topic
from weir.app.outbox import OutboxRelay, open_outbox, write
from weir.app.trigger_status import CompletionPublisher, child_done, record_status
from weir.tables.triggers import (
    DEFAULT_WAKE_TOPIC,
    OK,
    TRIGGERS_TOPIC,
    Message,
    completion_message,
    outcome_summary,
    publish_trigger_messages,
    registration_message,
)

pytestmark = pytest.mark.integration

STATS = re.compile(r"triggers stats: events=(\d+) batches=(\d+) completions=(\d+) state_writes=(\d+) table_writes=(\d+)")


def make_parents(count: int, *, seed: int) -> dict[str, dict[str, str]]:
    """Parent id -> child id -> outcome (1 to 20 children each, about one in eight failing)."""
    rng = random.Random(seed)
    parents = {}
    for number in range(count):
        children = rng.randint(1, 20)
        parents[f"parent-{number}"] = {f"child-{number}-{index}": "failed" if rng.random() < 0.12 else OK for index in range(children)}
    return parents


def create_topics(pipeline: Pipeline) -> None:
    asyncio.run(ensure_topics(pipeline.bootstrap, [pipeline.topic(TRIGGERS_TOPIC), pipeline.topic(DEFAULT_WAKE_TOPIC)], 4))


def publish(pipeline: Pipeline, messages: list[Message]) -> None:
    asyncio.run(publish_trigger_messages(pipeline.bootstrap, pipeline.prefix, messages))


def read_wakes(pipeline: Pipeline, *, expected: int, timeout_s: float, settle_s: float) -> list[dict[str, Any]]:
    """Every wake record once ``expected`` are there, read again after ``settle_s`` to catch a second firing."""
    topic = pipeline.topic(DEFAULT_WAKE_TOPIC)
    asyncio.run(read_topic(pipeline.bootstrap, topic, until=lambda rows: len(rows) >= expected, timeout_s=timeout_s, decode=orjson.loads))
    time.sleep(settle_s)
    return asyncio.run(read_to_end(pipeline.bootstrap, topic, decode=orjson.loads))


def dead_letters(pipeline: Pipeline) -> list[dict[str, Any]]:
    topic = pipeline.topic("dead-letters")
    return asyncio.run(read_topic(pipeline.bootstrap, topic, until=lambda rows: False, timeout_s=2.0, decode=orjson.loads))


def assert_woken_once(wakes: list[dict[str, Any]], parents: dict[str, dict[str, str]], pipeline: Pipeline) -> None:
    counts = Counter(wake["parent_id"] for wake in wakes)
    twice = {parent: count for parent, count in counts.items() if count > 1}
    missing = sorted(set(parents) - set(counts))
    assert not twice, f"parents woken more than once: {dict(list(twice.items())[:10])}"
    if missing:
        letters = [(letter["reason"], letter["step"], str(letter["error"])[:200]) for letter in dead_letters(pipeline)]
        raise AssertionError(f"{len(missing)} parents never woken, e.g. {missing[:10]}; dead letters: {letters[:5]}")
    assert not dead_letters(pipeline), "valid trigger messages must not be dead-lettered"
    for wake in wakes:
        children = parents[wake["parent_id"]]
        assert wake["trigger_id"] == wake["parent_id"]
        assert wake["expected_count"] == len(children)
        assert wake["summary"] == outcome_summary(children), wake
        assert wake["context"] == {"resume_at": f"step-after-{wake['parent_id']}"}


def trigger_stats(pipeline: Pipeline, *, events: int, timeout_s: float = 15.0) -> dict[str, int]:
    """The workers' last logged counters (summed), once they account for ``events`` events."""
    deadline = time.monotonic() + timeout_s
    totals: dict[str, int] = {}
    while time.monotonic() < deadline:
        totals = {"events": 0, "batches": 0, "completions": 0, "state_writes": 0, "table_writes": 0}
        for worker in pipeline.workers:
            lines = STATS.findall(worker.log_text())
            if lines:
                for name, value in zip(totals, lines[-1], strict=True):
                    totals[name] += int(value)
        if totals["events"] >= events:
            return totals
        time.sleep(0.5)
    return totals


def report(label: str, stats: dict[str, int], *, seconds: float) -> None:
    events = stats["events"]
    print(
        f"\n[{label}] {events} events in {stats['batches']} batches, {events / seconds:.0f} events/s end to end; "
        f"trigger state writes {stats['state_writes']} = {stats['state_writes'] / events:.3f} per event "
        f"({stats['state_writes'] / max(stats['completions'], 1):.3f} per completion); "
        f"all trigger table writes {stats['table_writes']} = {stats['table_writes'] / events:.3f} per event"
    )


def registration(parent_id: str, children: dict[str, str]) -> Message:
    return registration_message(parent_id, len(children), context={"resume_at": f"step-after-{parent_id}"})


def test_lost_completions_are_caught_by_the_sweep_within_interval_and_grace(pipeline: Pipeline, tmp_path: Path) -> None:
    create_topics(pipeline)
    children_db = str(tmp_path / "children.sqlite")
    interval_ms, grace_ms = 500, 1000
    rng = random.Random(23)
    parents = make_parents(200, seed=9)
    registrations = [registration(parent, children) for parent, children in parents.items()]
    children_messages: list[Message] = []
    lost: set[str] = set()
    for parent, children in parents.items():
        for child, outcome in children.items():
            if rng.random() < 0.05:
                lost.add(parent)  # the completion event of this child never reaches the broker
            else:
                children_messages.append(completion_message(parent, child, outcome))
    rng.shuffle(children_messages)
    assert 20 < len(lost) < 200
    outbox = open_outbox(children_db)
    worker = pipeline.start_worker(
        "triggers",
        WEIR_SWEEP_INTERVAL_MS=interval_ms,
        WEIR_SWEEP_GRACE_MS=grace_ms,
        WEIR_SWEEP_PAGE_SIZE=16,
        WEIR_TRIGGER_STATUS_DB=children_db,
    )
    worker.wait_ready()
    started = time.monotonic()
    publish(pipeline, registrations)
    with write(outbox, notify=lambda _: None) as tx:  # every child commits its status (its outbox rows are never relayed)
        for parent, children in parents.items():
            for child, outcome in children.items():
                child_done(tx, parent, child, outcome, topic_prefix=pipeline.prefix)
    outbox.close()
    publish(pipeline, children_messages)
    sent_ms = int(time.time() * 1000)
    wakes = read_wakes(pipeline, expected=len(parents), timeout_s=120, settle_s=2 * (interval_ms + grace_ms) / 1000 + 1)
    elapsed = time.monotonic() - started
    assert_woken_once(wakes, parents, pipeline)
    by_parent = {wake["parent_id"]: wake for wake in wakes}
    swept = {parent for parent, wake in by_parent.items() if wake["fired_by"] == "sweep"}
    assert lost <= swept, f"parents whose completions were lost must be fired by the sweep: {sorted(lost - swept)[:10]}"
    # A parent whose completions were all sent may be swept too when its grace passed before its completions were
    # processed: all its children had committed, so that firing is right (and still the only one).
    overtaken = swept - lost
    # Due at registration + grace, looked at on the next sweep tick (every interval); a trigger whose statuses were
    # not all committed yet at its first look is looked at again after max(grace, interval).
    late_ms = [by_parent[parent]["fired_ms"] - max(by_parent[parent]["registered_ms"] + grace_ms, sent_ms) for parent in lost]
    print(
        f"\n[sweep] {len(lost)} parents lost a completion; woken {min(late_ms)}..{max(late_ms)} ms after due (grace {grace_ms} ms); "
        f"{len(overtaken)} more swept before their completions were processed"
    )
    # 2.5 s of slack for processing and producing on a shared two-core machine
    assert max(late_ms) <= interval_ms + max(grace_ms, interval_ms) + 2500, f"sweep firings too late: {sorted(late_ms)[-5:]} ms"
    events = len(registrations) + len(children_messages)
    stats = trigger_stats(pipeline, events=events)
    report("5% completions lost", stats, seconds=elapsed)


def test_a_sigkill_of_a_trigger_worker_mid_run_wakes_every_parent_once(pipeline: Pipeline) -> None:
    create_topics(pipeline)
    rng = random.Random(31)
    parents = make_parents(300, seed=13)
    messages: list[Message] = [registration(parent, children) for parent, children in parents.items()]
    messages += [completion_message(parent, child, outcome) for parent, children in parents.items() for child, outcome in children.items()]
    rng.shuffle(messages)
    workers = [pipeline.start_worker("triggers", WEIR_SWEEP_INTERVAL_MS=1000) for _ in range(2)]
    for worker in workers:
        worker.wait_ready()
    # Traffic keeps coming until well after the group notices the death (session timeout 6 s): the survivor is
    # busy when its own partitions are revoked and given back with the dead worker's.
    chunks = 48
    size = len(messages) // chunks + 1
    for number in range(chunks):
        publish(pipeline, messages[number * size : (number + 1) * size])
        if number == 8:
            workers[1].kill()  # mid-run: its partitions, their batches and their table state move to the survivor
        time.sleep(0.25)
    wakes = read_wakes(pipeline, expected=len(parents), timeout_s=180, settle_s=3)
    assert_woken_once(wakes, parents, pipeline)


# The child of the seed's case: it commits its work and its status in one database transaction through the outbox,
# then waits to be killed; nothing of it is published (no relay runs).
CHILD = """
import sys, time
from weir.app.outbox import open_outbox, write
from weir.app.trigger_status import CompletionPublisher, child_done, record_status
location, prefix, parent_id, child_id = sys.argv[1:5]
outbox = open_outbox(location)
mark = "%s" if location.startswith("postgres") else "?"
with write(outbox) as tx:
    tx.connection.execute("CREATE TABLE IF NOT EXISTS child_work (child_id TEXT PRIMARY KEY)")
print("ready", flush=True)
sys.stdin.readline()
with write(outbox) as tx:
    tx.connection.execute(f"INSERT INTO child_work VALUES ({mark})", (child_id,))
    child_done(tx, parent_id, child_id, "failed", topic_prefix=prefix)
print("committed", time.time_ns() // 1_000_000, flush=True)
time.sleep(600)
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def children_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The children's database: a SQLite file, or a fresh schema on the session's PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "children.sqlite")
    return str(request.getfixturevalue("postgres_schema")())


def fired_marker(pipeline: Pipeline, parent_id: str) -> dict[str, Any] | None:
    """The parent's fired marker as the committed changelog of ``triggers_fired`` holds it last."""
    records = asyncio.run(read_to_end(pipeline.bootstrap, pipeline.topic("triggers_fired-changelog")))
    latest = {orjson.loads(record.key): record.value for record in records}
    value = latest.get(parent_id)
    return None if value is None else dict(orjson.loads(value))


def test_a_child_killed_after_its_commit_and_before_publishing_still_wakes_its_parent_once(pipeline: Pipeline, children_db: str) -> None:
    create_topics(pipeline)
    interval_ms, grace_ms = 1000, 2000
    # No WEIR_TRIGGER_STATUS_DB: the sweep reads the outbox's database by default, where child_done writes.
    worker = pipeline.start_worker("triggers", WEIR_SWEEP_INTERVAL_MS=interval_ms, WEIR_SWEEP_GRACE_MS=grace_ms, WEIR_OUTBOX_DB=children_db)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, children_db, pipeline.prefix, "parent", "killed"],
        env=pipeline.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        worker.wait_ready()
        publish(pipeline, [registration("parent", {"heard": OK, "killed": "failed"})])
        publish(pipeline, [completion_message("parent", "heard")])  # the other child ends as usual
        child.stdin.write("go\n")
        child.stdin.flush()
        word, committed_ms = child.stdout.readline().split()
        assert word == "committed"
        child.kill()  # SIGKILL: its completion is an outbox row no relay has published
    finally:
        child.kill()
        child.wait()
    outbox = open_outbox(children_db)
    try:
        assert outbox.pending_count() == 1, "the killed child published nothing"
        wakes = read_wakes(pipeline, expected=1, timeout_s=60, settle_s=2 * (interval_ms + grace_ms) / 1000)
        [wake] = wakes
        assert (wake["parent_id"], wake["fired_by"]) == ("parent", "sweep")
        assert wake["summary"] == outcome_summary({"heard": OK, "killed": "failed"})
        # Due at registration + grace (the first look), or at the next look after the commit if it came later.
        due_ms = max(wake["registered_ms"] + grace_ms, int(committed_ms))
        late_ms = wake["fired_ms"] - due_ms
        kind = "postgresql" if children_db.startswith("postgres") else "sqlite"
        print(f"\n[sweep from {kind}] woken {late_ms} ms after due (interval {interval_ms} ms, grace {grace_ms} ms)")
        # 2.5 s of slack for processing and producing on a shared two-core machine
        assert late_ms <= max(interval_ms, grace_ms) + interval_ms + 2500, f"the sweep fired {late_ms} ms after due"

        # The relay publishes the dead child's completion at last: counted late on the fired marker, no second wake.
        async def relay_until_drained() -> None:
            relay = OutboxRelay(
                outbox, bootstrap=pipeline.bootstrap, topic=pipeline.topic("outbox"), batch_size=10, on_sleep=lambda _: relay.stop()
            )
            await relay.run()

        asyncio.run(relay_until_drained())
        assert outbox.pending_count() == 0
        deadline = time.monotonic() + 30
        while (marker := fired_marker(pipeline, "parent")) is None or marker["late_completions"] < 1:
            assert time.monotonic() < deadline, f"the late completion was never absorbed: {marker}"
            time.sleep(0.5)
        time.sleep(2 * interval_ms / 1000)
        assert len(read_wakes(pipeline, expected=1, timeout_s=10, settle_s=0)) == 1, "the parent was woken once"
        assert not dead_letters(pipeline)
    finally:
        outbox.close()


def test_children_that_publish_straight_after_their_commit_and_one_that_dies_first_wake_their_parents_once(
    pipeline: Pipeline, children_db: str
) -> None:
    """The seed's own path, without an outbox: each child commits its work and its status row in its database, then
    publishes its completion straight to the broker; a child that dies between the two is found by the sweep. The
    worker names no status database: it reads the outbox's, the default, which is the children's here."""
    create_topics(pipeline)
    interval_ms, grace_ms = 500, 1500
    worker = pipeline.start_worker("triggers", WEIR_SWEEP_INTERVAL_MS=interval_ms, WEIR_SWEEP_GRACE_MS=grace_ms, WEIR_OUTBOX_DB=children_db)
    parents = make_parents(30, seed=41)
    dies = {parent: sorted(children)[0] for number, (parent, children) in enumerate(parents.items()) if number % 3 == 0}
    postgres = children_db.startswith("postgres")
    connect: Any
    if postgres:
        import psycopg

        connect = lambda: psycopg.connect(children_db)  # noqa: E731
        mark = "%s"
    else:
        import sqlite3

        connect = lambda: sqlite3.connect(children_db)  # noqa: E731
        mark = "?"
    with connect() as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS child_work (child_id TEXT PRIMARY KEY)")

    async def children() -> None:
        async with CompletionPublisher(pipeline.bootstrap, topic_prefix=pipeline.prefix) as completions:
            for parent, outcomes in parents.items():
                for child, outcome in outcomes.items():
                    connection = connect()
                    with connection:  # the child's own transaction: its work and its status
                        connection.execute(f"INSERT INTO child_work VALUES ({mark})", (child,))
                        record_status(connection, parent, child, outcome)
                    connection.close()
                    if dies.get(parent) != child:  # the dying child is gone before it publishes
                        await completions.done(parent, child, outcome)

    worker.wait_ready()
    publish(pipeline, [registration(parent, outcomes) for parent, outcomes in parents.items()])
    asyncio.run(children())
    wakes = read_wakes(pipeline, expected=len(parents), timeout_s=60, settle_s=2 * (interval_ms + grace_ms) / 1000)
    assert_woken_once(wakes, parents, pipeline)
    fired_by = {wake["parent_id"]: wake["fired_by"] for wake in wakes}
    assert {parent for parent, by in fired_by.items() if by == "sweep"} >= set(dies), "a parent whose child died before publishing is swept"
    assert any(by != "sweep" for by in fired_by.values()), "the published completions fire the others"


def test_a_triggers_worker_deletes_status_rows_past_their_retention(pipeline: Pipeline, tmp_path: Path) -> None:
    """The children's status table does not grow forever: rows older than WEIR_TRIGGER_STATUS_RETENTION_MS go, newer stay."""
    import sqlite3

    from weir.app.trigger_status import STATUS_TABLE, SQLiteStatusSource

    create_topics(pipeline)
    database = tmp_path / "children.sqlite"
    SQLiteStatusSource(database).ensure_table()
    now = int(time.time() * 1000)
    with sqlite3.connect(database) as connection:
        connection.executemany(
            f"INSERT INTO {STATUS_TABLE} VALUES (?, ?, ?, ?)",
            [("p-old", "c-1", OK, now - 86_400_000), ("p-old", "c-2", OK, now - 60_000), ("p-new", "c-1", OK, now + 3_600_000)],
        )
    # Retention 20 s: purged every 2 s; the row of a minute ago and the row of a day ago are past it.
    worker = pipeline.start_worker("triggers", WEIR_TRIGGER_STATUS_DB=str(database), WEIR_TRIGGER_STATUS_RETENTION_MS=20_000)
    worker.wait_ready()
    deadline = time.monotonic() + 30
    rows: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        with sqlite3.connect(database) as connection:
            rows = sorted(connection.execute(f"SELECT parent_id, child_id FROM {STATUS_TABLE}").fetchall())
        if rows == [("p-new", "c-1")]:
            break
        time.sleep(0.5)
    assert rows == [("p-new", "c-1")], "the rows past their retention are deleted, the others kept"
    assert "status rows past their retention deleted" in worker.log_text()
