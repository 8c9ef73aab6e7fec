"""Exactly-once on Faust, made sound: transaction routing by source partition and a fresh local state.

Faust (0.15) implements exactly-once with one transactional producer per assigned source partition
(Kafka's EOS v1) but has two gaps that lose or duplicate data under a crash:

* it picks the transaction of a send by the *destination* partition (faust-streaming/faust#517), so an
  output to another topic or partition lands in a transaction that commits without the source offset,
  or in none at all; we route every send made while an event is processed to the transaction of that
  event's source partition, which is the one that commits its offset;
* it commits a transaction without draining its own send buffer, where table changelog writes wait, so
  a changelog write could fall into the next transaction; we drain the buffer before every commit;
* its RocksDB files keep writes of transactions that later aborted (a SIGKILL between a table write and
  the commit): the restarted worker would skip work it never committed. Like Kafka Streams after an
  unclean shutdown, a worker under exactly_once starts from an empty local store and restores it from
  the committed changelog (see :func:`wipe_local_tables`).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import faust
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP
from faust.types.tuples import RecordMetadata

__all__ = ["WeirTransactionManager", "install", "wipe_local_tables"]

log = logging.getLogger(__name__)


class WeirTransactionManager(TransactionManager):
    """Faust's transaction manager with sends routed to the source partition's transaction."""

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp: float | None,
        headers: Any,
        *,
        transactional_id: str | None = None,
    ) -> Awaitable[RecordMetadata]:
        event = faust.current_event()
        if event is None:
            # Buffered table changelog writes arrive here without an event; they go to the source
            # partition's number in a topic co-partitioned with it, which is the same transaction.
            return await super().send(topic, key, value, partition, timestamp, headers)
        source: TP = event.message.tp
        group = self.app.assignor.group_for_topic(source.topic)
        source_transaction = f"{self.app.conf.id}-{group}-{source.partition}"
        return await self.producer.send(topic, key, value, partition, timestamp, headers, transactional_id=source_transaction)

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        # Table changelog writes wait in Faust's send buffer: they belong to this transaction.
        await self.app.producer.buffer.flush()
        return await super().commit(offsets, start_new_transaction=start_new_transaction)


def install() -> None:
    """Make every Faust app in this process use :class:`WeirTransactionManager`."""
    aiokafka_driver.Transport.TransactionManager = WeirTransactionManager


def wipe_local_tables(tabledir: Path) -> None:
    """Drop local RocksDB files so that tables restore from the committed changelog only."""
    if tabledir.exists():
        log.info("exactly_once: local table files at %s are rebuilt from the changelog", tabledir)
        shutil.rmtree(tabledir)
