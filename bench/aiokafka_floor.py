"""The inline work on aiokafka alone, for `python -m bench.compare`: what weir's Kafka client costs before Faust or weir.

Run as ``python -m bench.aiokafka_floor`` with BENCH_APP_ID, BENCH_ORDERS and BENCH_AGGREGATES set (bench/compare.py
sets them, and starts as many processes, in one consumer group, as the other inline rows have).

The same work as Quix Streams' inline form (``bench.quix_split_aggregate.price_order``: every item priced, the
order's result in weir's shape) and the same guarantee: a transactional producer, read_committed, each
transaction carrying the consumed offsets (``send_offsets_to_transaction``), committed every
BENCH_COMMIT_INTERVAL seconds (weir's default, 0.1) and whenever the consumer has nothing ready. Batches as
weir takes them: up to BENCH_BATCH_SIZE records (weir's WEIR_BATCH_SIZE default, 500) per ``getmany``. One
``orjson`` decode and encode per record. Nothing else: no tables, no dead letters, no retries, no web server,
no Faust. Its CPU per order is the floor of any pipeline built on aiokafka's pure-Python client doing this work
with these guarantees; the difference to Quix Streams' row is what the client costs (Quix runs on librdkafka).

A rebalance commits the open transaction before the partitions go (``on_partitions_revoked``); a crash is not
handled beyond what Kafka's transactions give (this is a measurement, not a worker).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from bench.quix_split_aggregate import price_order
from weir.app.settings import default_bootstrap

__all__ = ["run"]


class _Loop(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka ships no type hints for the listener
    def __init__(self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, group: str) -> None:
        self.consumer = consumer
        self.producer = producer
        self.group = group
        self.offsets: dict[TopicPartition, int] = {}
        self.open = False
        #: held while a batch is handled and while a transaction commits: a rebalance commits between batches
        self.lock = asyncio.Lock()

    async def commit(self) -> None:
        if not self.open:
            return
        if self.offsets:
            await self.producer.send_offsets_to_transaction(self.offsets, self.group)
        await self.producer.commit_transaction()
        self.offsets = {}
        self.open = False

    async def on_partitions_revoked(self, revoked: Any) -> None:
        async with self.lock:
            await self.commit()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        return None


async def run() -> None:
    group = os.environ.get("BENCH_APP_ID", "bench-aiokafka")
    orders, aggregates = os.environ["BENCH_ORDERS"], os.environ["BENCH_AGGREGATES"]
    interval = float(os.environ.get("BENCH_COMMIT_INTERVAL", "0.1"))
    batch = int(os.environ.get("BENCH_BATCH_SIZE", "500"))
    bootstrap = default_bootstrap()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"{group}-{os.getpid()}",
        enable_idempotence=True,
        linger_ms=int(os.environ.get("BENCH_PRODUCER_LINGER_MS", "0")),
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    loop = _Loop(consumer, producer, group)
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stopping.set)
    await producer.start()
    consumer.subscribe([orders], listener=loop)
    await consumer.start()
    last_commit = time.monotonic()
    try:
        while not stopping.is_set():
            records = await consumer.getmany(timeout_ms=5, max_records=batch)
            async with loop.lock:
                assigned = consumer.assignment()
                for tp, messages in records.items():
                    if tp not in assigned:
                        continue  # revoked since the fetch: its new owner reads them from the committed offset
                    if not loop.open:
                        await producer.begin_transaction()
                        loop.open = True
                    for message in messages:
                        result = price_order(orjson.loads(message.value))
                        await producer.send(aggregates, key=message.key, value=orjson.dumps(result))
                    loop.offsets[tp] = messages[-1].offset + 1
                if loop.open and (not records or time.monotonic() - last_commit >= interval):
                    await loop.commit()
                    last_commit = time.monotonic()
    finally:
        async with loop.lock:
            await loop.commit()
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    asyncio.run(run())
