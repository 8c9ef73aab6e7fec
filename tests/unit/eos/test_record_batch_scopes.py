"""When a part's sends are queued in the producer (``app.engine.produce``): under exactly_once when the batch ends (a
commit waits for the batch: it is gated), under at_least_once when the part ends, before its events are acked (that
commit is not gated: it flushes the producer and commits what is acked, and a part acked with its records only noted
had its offsets committed without them). A Faust send inside a part queues what the part noted first."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatch

from tests.unit.eos.test_direct_changelog import PARTITION, Event, Transactions
from weir.app.engine import overlay
from weir.app.engine.scopes import batch_scope


class Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


def at_least_once_app(transactions: Transactions) -> Any:
    """An app outside a transaction, whose started producer is ``transactions``' aiokafka producer."""
    producer = transactions.producer._transaction_producers["t"]
    producer._txn_manager = None
    return SimpleNamespace(in_transaction=False, producer=SimpleNamespace(started=True, _ensure_producer=lambda: producer))


def exactly_once_app(transactions: Transactions) -> Any:
    return SimpleNamespace(in_transaction=True, consumer=SimpleNamespace(transactions=transactions))


def run_two_parts(app: Any, transactions: Transactions) -> list[int]:
    """Two parts of one batch, each sending a record; how many records were queued after each part, and after the batch."""
    queued: list[int] = []

    async def run() -> None:
        async with batch_scope() as scope:
            for value in (b"1", b"2"):
                async with scope.part(Event(app)):
                    await overlay.send_record(Topic("out"), b"k", value, partition=PARTITION)
                queued.append(len(transactions.sent))
        queued.append(len(transactions.sent))

    asyncio.run(run())
    return queued


def test_at_least_once_queues_a_part_s_records_before_the_part_is_acked() -> None:
    transactions = Transactions()
    assert run_two_parts(at_least_once_app(transactions), transactions) == [1, 2, 2]
    assert [value for _, _, _, value in transactions.sent] == [b"1", b"2"]


def test_exactly_once_queues_the_batch_s_records_together_when_it_ends() -> None:
    transactions = Transactions()
    assert run_two_parts(exactly_once_app(transactions), transactions) == [0, 0, 2]
    assert [value for _, _, _, value in transactions.sent] == [b"1", b"2"]


def test_records_of_one_partition_from_two_parts_go_in_one_record_batch() -> None:
    transactions = Transactions()
    batches: list[list[bytes]] = []
    producer = transactions.producer._transaction_producers["t"]

    async def send_batch(batch: Any, topic: str, *, partition: int) -> Any:
        batches.append([record.value for record in DefaultRecordBatch(bytes(batch._build()))])
        return await transactions.send_batch(batch, topic, partition=partition)

    producer.send_batch = send_batch
    run_two_parts(exactly_once_app(transactions), transactions)
    assert batches == [[b"1", b"2"]]
