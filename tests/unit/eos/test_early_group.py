"""The consumer group joins a transaction once its first partitions did, not at the commit (``kip447._early_group_to_add``)."""

from __future__ import annotations

import asyncio

from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from weir.app.engine import kip447

TP = TopicPartition("items", 0)


def transaction(early_group: str | None) -> TransactionManager:
    kip447.install(per_worker=False)
    manager = TransactionManager("weir-worker-1", 10_000)
    manager.set_pid_and_epoch(1, 0)
    manager.weir_early_group = early_group  # type: ignore[attr-defined]
    manager.begin_transaction()
    return manager


async def group_added_once_the_transaction_is_open() -> None:
    manager = transaction("weir")
    assert manager.consumer_group_to_add() is None  # nothing sent: no transaction on the coordinator yet
    manager.maybe_add_partition_to_txn(TP)
    assert manager.consumer_group_to_add() is None  # its partitions are not added yet
    manager.partition_added(TP)
    assert manager.consumer_group_to_add() == "weir"
    manager.consumer_group_added("weir")
    assert manager.consumer_group_to_add() is None


def test_the_group_is_added_once_the_transaction_is_open_on_the_coordinator() -> None:
    # aiokafka's transaction manager makes futures: it belongs to a running loop
    asyncio.run(group_added_once_the_transaction_is_open())


def test_offsets_sent_after_the_early_add_go_straight_to_the_offset_commit() -> None:
    async def scenario() -> None:
        manager = transaction("weir")
        manager.maybe_add_partition_to_txn(TP)
        manager.partition_added(TP)
        manager.consumer_group_added(manager.consumer_group_to_add())
        offsets = {TP: OffsetAndMetadata(42, "")}
        manager.add_offsets_to_txn(offsets, "weir")
        assert manager.consumer_group_to_add() is None  # no second AddOffsetsToTxn
        assert manager.offsets_to_commit() == (offsets, "weir")

    asyncio.run(scenario())


async def nothing_added_early() -> None:
    plain = transaction(None)
    plain.maybe_add_partition_to_txn(TP)
    plain.partition_added(TP)
    assert plain.consumer_group_to_add() is None
    ending = transaction("weir")
    ending.maybe_add_partition_to_txn(TP)
    ending.partition_added(TP)
    ending.aborting_transaction()
    assert ending.consumer_group_to_add() is None  # an abort goes straight to EndTxn


def test_a_producer_without_a_group_and_an_ending_transaction_add_nothing_early() -> None:
    asyncio.run(nothing_added_early())
