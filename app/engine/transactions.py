"""Faust's transactions routed by source partition, one per worker or one per source partition; its producer for them.

The commit itself, step by step, is :mod:`app.engine.commit`; the KIP-447 requests a per-worker transaction
needs are :mod:`app.engine.kip447`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any, cast

import faust
from faust.transport.consumer import TransactionManager
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TP
from faust.types.tuples import RecordMetadata

from weir.app.engine import kip447
from weir.app.engine.commit import commit_transactions
from weir.app.engine.config import installed, worker_slot

__all__ = ["WeirTransactionManager", "WeirProducer"]

log = logging.getLogger(__name__)


class WeirTransactionManager(TransactionManager):
    """Faust's transaction manager: one transaction per worker (``EngineConfig.worker_transaction``), or one per source
    partition that every send made for that partition's events joins.

    Per worker, the id is ``<app id>-worker-<WEIR_WORKER_ID or worker_slot()>``. Per partition, a
    transactional id is ``<app id>-<n>p-<partition>`` where ``n`` is the topic's partition count: the
    topics one worker consumes, and its tables' changelogs, are co-partitioned (the assignor gives
    partition ``i`` of all of them to the same member), so partition ``i`` of all of them shares one
    transaction, the one that also commits their offsets. Faust's own grouping reads the assignor's
    topic groups, which are empty for a stage without tables (a KeyError on the first send).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._partition_counts: dict[str, int] = {}
        self._worker_id: str | None = None

    def transactional_id_for(self, topic: str, partition: int) -> str:
        """The transactional id of the transaction that a send for ``topic``'s ``partition`` (or its offset) joins."""
        worker_transaction = installed().worker_transaction
        if worker_transaction is not None:
            # Asked on every send: the host name and the settings lookups cost a few % of a busy worker.
            # Fixed once the first transaction began (the web port is set by then, ``worker_slot``).
            if self._worker_id is None:
                self._worker_id = f"{self.app.conf.id}-worker-{worker_transaction or worker_slot(self.app.conf.web_port)}"
            return self._worker_id
        return f"{self.app.conf.id}-{self._partition_count(topic)}p-{partition}"

    def _partition_count(self, topic: str) -> int:
        """The topic's partition count as the transactional ids use it: the same for a topic all along.

        The consumer's metadata snapshot lists a topic created a moment ago (a changelog on a fresh topic
        set, sometimes a source topic) with 0 partitions, and the two sides of one transaction must not
        disagree: a changelog write routed to "...-4p-0" while its event's outputs and offsets went to
        "...-0p-0" stayed in a transaction nobody committed, and a fresh "...-0p-0" with no producer
        crashed the worker. So an unknown count is the count weir declared the topic (or the changelog's
        table) with, and a count once known is kept. A topic weir did not declare and the snapshot does
        not know (the assignor's leader topic at start) is 0: guessing would name another transaction.
        """
        count = self._partition_counts.get(topic)
        if count is None:
            count = self.app.consumer.topic_partitions(topic) or self._declared_partitions(topic)
            if count:
                self._partition_counts[topic] = count
        return count or 0

    def _declared_partitions(self, topic: str) -> int | None:
        default = int(self.app.conf.topic_partitions)
        for channel in list(self.app.topics):
            if topic in getattr(channel, "topics", ()):
                return int(channel.partitions or default)
        for table in self.app.tables.values():
            if table.changelog_topic_name == topic:
                return int(table.partitions or default)
        return None

    async def _start_transactions(self, tids: Any) -> None:
        # A worker that keeps partitions across a rebalance keeps their producer, its transaction open
        # since the commit before the rebalance (with one transaction per worker, always the case).
        producer = cast(aiokafka_driver.Producer, self.producer)
        for transactional_id in tids:
            running = producer._transaction_producers.get(transactional_id)
            if running is None or not running._txn_manager.is_in_transaction():
                await producer.maybe_begin_transaction(transactional_id)

    def _tps_to_transactional_ids(self, tps: set[TP]) -> set[str]:
        assignor = self.app.assignor
        return {self.transactional_id_for(tp.topic, tp.partition) for tp in tps if not assignor.is_standby(tp)}

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
        if event is not None:
            source: TP = event.message.tp
            owner = self.transactional_id_for(source.topic, source.partition)
        else:
            # Buffered table changelog writes (and timer sends) come without an event: they name their
            # partition, which is the source partition's number in a co-partitioned topic.
            destination = self.consumer.key_partition(topic, key, partition)
            owner = self.transactional_id_for(topic, destination if destination is not None else partition or 0)
        return await self.producer.send(topic, key, value, partition, timestamp, headers, transactional_id=owner)

    async def commit(self, offsets: Mapping[TP, int], start_new_transaction: bool = True) -> bool:
        """Steps 3 to 6 of the commit (:mod:`app.engine.commit`): inside the commit gate already, which
        ``WeirConsumer.force_commit`` closed before the offsets were chosen."""
        return await commit_transactions(self, offsets, start_new_transaction)


class WeirProducer(aiokafka_driver.Producer):
    """Faust's producer; with one transaction per worker, its transactional producer commits offsets with the
    consumer group's generation (KIP-447, :mod:`app.engine.kip447`) and a transaction timeout of weir's choosing."""

    def _settings_extra(self) -> Mapping[str, Any]:
        extra = dict(super()._settings_extra())
        config = installed()
        if config.worker_transaction is not None and self.app.in_transaction:
            extra["transaction_timeout_ms"] = config.transaction_timeout_ms
        return extra

    def _new_producer(self, transactional_id: str | None = None) -> Any:
        producer = super()._new_producer(transactional_id=transactional_id)
        if transactional_id is not None and installed().worker_transaction is not None:
            log.info("exactly_once: this worker's transactions run under transactional id %s", transactional_id)
            kip447.attach_group_member(producer, self._group_member, group_id=self.app.conf.id)
        return producer

    def _group_member(self) -> kip447.GroupMember:
        """The consumer's generation and member id now (read from the consumer thread's coordinator)."""
        coordinator = cast(Any, self.app.consumer)._thread._ensure_consumer()._coordinator
        return coordinator.generation, coordinator.member_id, coordinator._group_instance_id
