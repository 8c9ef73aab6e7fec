"""KIP-447 on aiokafka (app/engine/kip447.py) against the real broker: the group fences a stale member's transactional
offsets, and a committed-offset fetch waits for a transaction whose offsets are still pending."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import CommitFailedError
from aiokafka.structs import TopicPartition

from weir.app.engine import kip447
from weir.app.kafka_io import ensure_topics

pytestmark = pytest.mark.integration


@asynccontextmanager
async def member_of(bootstrap: str, group: str, topic: str, instance: str | None = None) -> AsyncIterator[AIOKafkaConsumer]:
    """A read_committed consumer that has joined ``group`` (as static member ``instance``) and owns every partition of ``topic``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        group_instance_id=instance,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        for _ in range(100):
            await consumer.getmany(timeout_ms=100)
            if consumer.assignment():
                break
        assert consumer.assignment(), "the consumer never joined its group"
        yield consumer
    finally:
        await consumer.stop()


@asynccontextmanager
async def transactional(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"kip447-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


def group_member(consumer: AIOKafkaConsumer) -> kip447.GroupMember:
    coordinator = consumer._coordinator
    return coordinator.generation, coordinator.member_id, coordinator._group_instance_id


async def fresh_topic(bootstrap: str) -> tuple[str, str, TopicPartition]:
    """A new one-partition topic, a new group name, and the topic's partition."""
    topic, group = f"kip447-{uuid.uuid4().hex[:8]}", f"kip447-g-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, [topic], 1)
    return topic, group, TopicPartition(topic, 0)


@pytest.fixture
def stable_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The v3 offset commit installed, and this test's committed-offset fetches with require_stable."""
    kip447.install(per_worker=False)
    monkeypatch.setattr(GroupCoordinator, "_do_fetch_commit_offsets", kip447._stable_fetch_commit_offsets)


async def group_added_early(producer: AIOKafkaProducer, group: str) -> None:
    """The open transaction added ``group`` (AddOffsetsToTxn) on its own, before any offsets were sent."""
    manager = producer._txn_manager
    for _ in range(200):
        if manager._txn_consumer_group == group:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the transaction did not add group {group} before its offsets were sent")


async def assert_refused(
    producer: AIOKafkaProducer, member: kip447.GroupMember, tp: TopicPartition, group: str, early: bool = False
) -> None:
    """Offsets committed in a transaction as ``member`` are refused, and the transaction can only abort.

    ``early``: the transaction adds the group as soon as its partition is added (as weir's workers do).
    """
    kip447.attach_group_member(producer, lambda: member, group_id=group if early else None)
    await producer.begin_transaction()
    await producer.send_and_wait(tp.topic, b"refused")
    if early:
        await group_added_early(producer, group)
    with pytest.raises(CommitFailedError):
        await producer.send_offsets_to_transaction({tp: 1}, group)
    await producer.abort_transaction()


async def assert_commits(
    producer: AIOKafkaProducer,
    member: kip447.GroupMember,
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    group: str,
    offset: int,
    early: bool = False,
) -> None:
    """Offsets committed in a transaction as ``member`` are taken: ``consumer`` reads ``offset`` back."""
    kip447.attach_group_member(producer, lambda: member, group_id=group if early else None)
    await producer.begin_transaction()
    await producer.send_and_wait(tp.topic, b"current")
    if early:
        await group_added_early(producer, group)
    await producer.send_offsets_to_transaction({tp: offset}, group)
    await producer.commit_transaction()
    assert (await consumer.committed(tp)) == offset


def test_offsets_of_a_stale_generation_are_refused_and_a_current_one_commits(kafka_bootstrap: str, stable_offsets: None) -> None:
    # (require_stable: the fetch right after a commit might otherwise still miss its offsets, the race KIP-447 closes)
    asyncio.run(stale_generation_refused(kafka_bootstrap))


async def stale_generation_refused(kafka_bootstrap: str) -> None:
    topic, group, tp = await fresh_topic(kafka_bootstrap)
    async with member_of(kafka_bootstrap, group, topic) as consumer, transactional(kafka_bootstrap) as producer:
        generation, member_id, _ = group_member(consumer)
        await assert_refused(producer, (generation - 1, member_id, None), tp, group)
        # a consumer removed from its group has generation -1 and no member id: the broker would not check those
        await assert_refused(producer, (-1, "", None), tp, group)

        await assert_commits(producer, (generation, member_id, None), consumer, tp, group, 2)


def test_a_transaction_that_added_its_group_early_commits_current_offsets_and_is_refused_stale_ones(
    kafka_bootstrap: str, stable_offsets: None
) -> None:
    asyncio.run(early_group(kafka_bootstrap))


async def early_group(kafka_bootstrap: str) -> None:
    topic, group, tp = await fresh_topic(kafka_bootstrap)
    async with member_of(kafka_bootstrap, group, topic) as consumer, transactional(kafka_bootstrap) as producer:
        generation, member_id, _ = group_member(consumer)
        await assert_commits(producer, (generation, member_id, None), consumer, tp, group, 4, early=True)
        await assert_refused(producer, (generation - 1, member_id, None), tp, group, early=True)
        await assert_commits(producer, (generation, member_id, None), consumer, tp, group, 6, early=True)


def test_offsets_of_a_static_member_whose_instance_id_was_taken_over_are_refused(kafka_bootstrap: str, stable_offsets: None) -> None:
    asyncio.run(replaced_static_member_refused(kafka_bootstrap))


async def replaced_static_member_refused(kafka_bootstrap: str) -> None:
    topic, group, tp = await fresh_topic(kafka_bootstrap)
    async with member_of(kafka_bootstrap, group, topic, instance="slot-1") as first:
        replaced = group_member(first)
        # the worker restarted in its slot (WEIR_STATIC_MEMBERSHIP): same instance id, a new member id
        async with member_of(kafka_bootstrap, group, topic, instance="slot-1") as restarted, transactional(kafka_bootstrap) as producer:
            current = group_member(restarted)
            assert current[1] != replaced[1], "a restarted static member has a new member id"
            assert current[2] == replaced[2] == "slot-1"
            await assert_refused(producer, replaced, tp, group)
            await assert_commits(producer, current, restarted, tp, group, 3)


def test_a_committed_offset_pending_in_an_open_transaction_is_read_once_it_commits(kafka_bootstrap: str, stable_offsets: None) -> None:
    asyncio.run(pending_offset_waits(kafka_bootstrap))


async def pending_offset_waits(kafka_bootstrap: str) -> None:
    topic, group, tp = await fresh_topic(kafka_bootstrap)
    async with member_of(kafka_bootstrap, group, topic) as consumer, transactional(kafka_bootstrap) as producer:
        kip447.attach_group_member(producer, lambda: group_member(consumer))
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"first")
        await producer.send_offsets_to_transaction({tp: 7}, group)
        # the offsets are pending in the open transaction: the fetch must wait, not return "no offset"
        fetch = asyncio.ensure_future(consumer._coordinator.fetch_committed_offsets([tp]))
        await asyncio.sleep(1.5)
        assert not fetch.done(), f"a pending offset was read before its transaction ended: {fetch.result()}"
        await producer.commit_transaction()
        offsets = await asyncio.wait_for(fetch, 10)
        assert offsets[tp].offset == 7


def test_wait_settled_returns_once_no_transaction_is_open(kafka_bootstrap: str) -> None:
    asyncio.run(settled_after_commit(kafka_bootstrap))


async def settled_after_commit(kafka_bootstrap: str) -> None:
    topic, group, tp = await fresh_topic(kafka_bootstrap)
    async with member_of(kafka_bootstrap, group, topic) as consumer, transactional(kafka_bootstrap) as producer:
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"open")
        waiting = asyncio.ensure_future(kip447.wait_settled(consumer, [tp]))
        await asyncio.sleep(1.0)
        assert not waiting.done(), "returned while a transaction was open on the partition"
        await producer.commit_transaction()
        await asyncio.wait_for(waiting, 10)
        assert (await consumer.end_offsets([tp]))[tp] == 2  # the record and the commit marker
