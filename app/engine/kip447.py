"""What one transaction per worker needs from Kafka and aiokafka does not offer: KIP-447 on aiokafka.

With one transactional producer per *source partition* (Kafka's EOS v1, Faust's design), a worker runs
as many transactions as it owns partitions, and each commit ends all of them: four partitions of two
topics cost four transactions per commit, each a few broker round trips, and as many small produce
requests. Kafka's EOS v2 (KIP-447, Kafka Streams' ``exactly_once_v2``) runs *one* transaction per worker.
It stays exactly-once because the fencing moves from the transactional id to the consumer group:

* a transaction's offsets are committed with the consumer's group generation and member id
  (``TxnOffsetCommit`` v3): a worker that lost its partitions in a rebalance it did not take part in
  (a zombie) gets ``ILLEGAL_GENERATION`` or ``UNKNOWN_MEMBER_ID``, and its transaction must abort;
* a worker taking partitions over reads their committed offsets with ``require_stable``
  (``OffsetFetch`` v7): while a transaction with offsets for them is still open (its owner was killed
  before it ended, or its markers are being written) the broker answers ``UNSTABLE_OFFSET_COMMIT``,
  and the fetch waits until that transaction has committed or been aborted (at the latest after the
  transaction timeout);
* a table's changelog partition is restored only once no transaction is open on it (its last stable
  offset reached its high watermark, :func:`wait_settled`): a commit's markers are written to every
  partition of the transaction, the offsets' partition need not be the last.

aiokafka (0.14) sends ``TxnOffsetCommit`` v0 and ``OffsetFetch`` up to v3: neither carries these fields.
This module defines the two requests and installs them into aiokafka's producer sender and group
coordinator: the v3 commit is sent only by producers given a group member (:func:`attach_group_member`),
the stable fetch only after :func:`install` with ``per_worker=True``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

from aiokafka import errors as Errors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Boolean, CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from weir.app.engine import offsets

__all__ = ["GroupMember", "attach_group_member", "install", "wait_settled", "UnstableOffsetCommitError"]

log = logging.getLogger(__name__)

#: (generation id, member id, group instance id) of the consumer whose offsets a transaction commits.
GroupMember = tuple[int, str, str | None]

_FENCED_MEMBER = (Errors.IllegalGenerationError, Errors.UnknownMemberIdError)
#: FENCED_INSTANCE_ID: a static member (WEIR_STATIC_MEMBERSHIP) whose instance id a newer member took over
#: (aiokafka has no class for it).
_FENCED_INSTANCE_ID = 82


def _per_topic(name: str, partitions: Any) -> CompactArray:
    """The flexible versions' ``[(topic name, partitions, tags)]`` array, as every schema here has one."""
    return CompactArray((name, CompactString("utf-8")), ("partitions", partitions), ("tags", TaggedFields))


class UnstableOffsetCommitError(Errors.BrokerResponseError):  # type: ignore[misc]
    """A transaction with offsets for the partition is still open: ask again (Kafka's error 88)."""

    errno = 88
    message = "UNSTABLE_OFFSET_COMMIT"
    description = "There are unstable offsets that need to be cleared."
    retriable = True


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", _per_topic("name", CompactArray(("partition", Int32), ("error_code", Int16), ("tags", TaggedFields)))),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            _per_topic(
                "name",
                CompactArray(
                    ("partition", Int32),
                    ("offset", Int64),
                    ("leader_epoch", Int32),
                    ("metadata", CompactString("utf-8")),
                    ("tags", TaggedFields),
                ),
            ),
        ),
        ("tags", TaggedFields),
    )


class GroupTxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    """``TxnOffsetCommit`` with the group member's generation: the group coordinator fences a stale one."""

    API_KEY = 28

    def __init__(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member: GroupMember,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        self._fields = (transactional_id, group_id, producer_id, producer_epoch, *member)
        by_topic: dict[str, list[tuple[int, int, int, str, dict[int, bytes]]]] = collections.defaultdict(list)
        for tp, offset in sorted(offsets.items()):
            by_topic[tp.topic].append((tp.partition, offset.offset, -1, offset.metadata, {}))
        self._topics: list[tuple[str, list[Any], dict[int, bytes]]] = [(topic, parts, {}) for topic, parts in by_topic.items()]

    def build(self, request_struct_class: type[TxnOffsetCommitRequest_v3]) -> TxnOffsetCommitRequest_v3:
        return request_struct_class(*self._fields, self._topics, {})


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            _per_topic(
                "topic",
                CompactArray(
                    ("partition", Int32),
                    ("offset", Int64),
                    ("leader_epoch", Int32),
                    ("metadata", CompactString("utf-8")),
                    ("error_code", Int16),
                    ("tags", TaggedFields),
                ),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 9
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        ("topics", _per_topic("topic", CompactArray(Int32))),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetchRequest(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]
    """``OffsetFetch`` with ``require_stable``: offsets still pending in an open transaction are not returned."""

    API_KEY = 9

    def __init__(self, group_id: str, partitions: Iterable[TopicPartition]) -> None:
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for tp in partitions:
            by_topic[tp.topic].append(tp.partition)
        self._group_id = group_id
        self._topics: list[tuple[str, list[int], dict[int, bytes]]] = [(topic, numbers, {}) for topic, numbers in by_topic.items()]

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> OffsetFetchRequest_v7:
        return request_struct_class(self._group_id, self._topics, True, {})


def _refuse(txn_manager: Any, reason: str) -> None:
    """Fail the transaction with Kafka's CommitFailedException: it can only abort now.

    ``send_offsets_to_transaction`` raises it, ``commit_transaction`` would again; an abort does not look at
    it, and asyncio would log it as never retrieved.
    """
    txn_manager.error_transaction(Errors.CommitFailedError(reason))
    txn_manager._transaction_waiter.exception()


def attach_group_member(producer: Any, member: Callable[[], GroupMember], group_id: str | None = None) -> None:
    """Make a transactional aiokafka producer commit offsets with ``member()``'s generation (TxnOffsetCommit v3).

    ``group_id``: the group whose offsets its transactions commit; each transaction adds it as soon as its
    first partitions are added (:func:`_early_group_to_add`), not when the offsets are sent.
    """
    producer._txn_manager.weir_group_member = member
    producer._txn_manager.weir_early_group = group_id


def _early_group_to_add(original: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """aiokafka's ``TransactionManager.consumer_group_to_add``, naming the producer's group early.

    aiokafka adds the consumer group to a transaction (``AddOffsetsToTxn``) only when the offsets are sent,
    at the commit: one broker round trip of the three a commit waits for (then ``TxnOffsetCommit`` and
    ``EndTxn``), while the worker's events are held back. Here the sender adds the group as soon as the
    transaction's first partitions are added (the transaction is open on the coordinator then, so adding
    the group starts no transaction timeout of its own), alongside the transaction's produce requests.
    A transaction whose group is added and whose offsets are never sent commits no offsets, as before.
    """
    from aiokafka.producer.transaction_manager import TransactionState

    def consumer_group_to_add(self: Any) -> str | None:
        group = original(self)
        if group is None and self._txn_consumer_group is None and self._txn_partitions and self.state == TransactionState.IN_TRANSACTION:
            return getattr(self, "weir_early_group", None)
        return group

    return consumer_group_to_add


def _group_txn_offset_commit_handler() -> type:
    from aiokafka.producer.sender import TxnOffsetCommitHandler

    class GroupTxnOffsetCommitHandler(TxnOffsetCommitHandler):  # type: ignore[misc]
        """aiokafka's handler, sending v3 with the member's generation; a stale member aborts the transaction."""

        def __init__(self, sender: Any, offsets: Any, group_id: str, member: GroupMember) -> None:
            super().__init__(sender, offsets, group_id)
            self._member = member

        def create_request(self) -> GroupTxnOffsetCommitRequest:
            txn = self._sender._txn_manager
            return GroupTxnOffsetCommitRequest(
                txn.transactional_id, self._group_id, txn.producer_id, txn.producer_epoch, self._member, self._offsets
            )

        def handle_response(self, resp: Any) -> Any:
            errors = []
            for topic, partitions, _ in resp.topics:
                for partition, error_code, _ in partitions:
                    error_type = Errors.for_code(error_code)
                    if error_type in _FENCED_MEMBER or error_code == _FENCED_INSTANCE_ID:
                        # this worker is no longer the member that owns these partitions
                        name = error_type.__name__ if error_code != _FENCED_INSTANCE_ID else "FENCED_INSTANCE_ID"
                        _refuse(self._sender._txn_manager, f"offsets of {topic}[{partition}] refused: {name}")
                        return None
                errors.append((topic, [(partition, error_code) for partition, error_code, _ in partitions]))
            return super().handle_response(SimpleNamespace(errors=errors))

    return GroupTxnOffsetCommitHandler


async def _stable_fetch_commit_offsets(self: Any, partitions: Any) -> dict[TopicPartition, OffsetAndMetadata]:
    """aiokafka's ``GroupCoordinator._do_fetch_commit_offsets`` with ``require_stable`` (OffsetFetch v7)."""
    response = await self._send_req(StableOffsetFetchRequest(self.group_id, partitions))
    top_error = Errors.for_code(response.error_code)
    if top_error is not Errors.NoError:
        if top_error is Errors.NotCoordinatorForGroupError:
            self.coordinator_dead()
        raise top_error()
    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
    for topic, topic_partitions, _ in response.topics:
        for partition, offset, _, metadata, error_code, _ in topic_partitions:
            tp = TopicPartition(topic, partition)
            if error_code == UnstableOffsetCommitError.errno:
                # fetch_committed_offsets retries a retriable error after its backoff
                log.info("committed offset of %s is pending in an open transaction: waiting for it to end", tp)
                raise UnstableOffsetCommitError()
            error_type = Errors.for_code(error_code)
            if error_type is not Errors.NoError:
                if error_type is Errors.NotCoordinatorForGroupError:
                    self.coordinator_dead()
                    raise error_type()
                if error_type is Errors.UnknownTopicOrPartitionError:
                    log.warning("OffsetFetchRequest -- unknown topic %s", topic)
                    continue
                if error_type is Errors.GroupAuthorizationFailedError:
                    raise error_type(self.group_id)
                if error_type.retriable:
                    raise error_type()
                raise Errors.KafkaError(repr(error_type()))
            if offset != -1:
                offsets[tp] = OffsetAndMetadata(offset, metadata)
    return offsets


#: How soon a transaction asks again to add its first partition while the last one's markers are being written.
CONCURRENT_TRANSACTIONS_BACKOFF_S = 0.005


def install(per_worker: bool) -> None:
    """Teach aiokafka's sender the v3 offset commit and the early group add (for producers with a group
    member: :func:`attach_group_member`); with ``per_worker``
    (this process runs one transaction per worker), make every committed-offset fetch wait for open
    transactions, and a transaction's first partitions ask again sooner while the last commit ends."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.producer import sender as sender_module

    if per_worker:
        GroupCoordinator._do_fetch_commit_offsets = _stable_fetch_commit_offsets
        # One transaction per worker begins again right after each commit: its first AddPartitionsToTxn
        # often meets the last commit's markers still being written (CONCURRENT_TRANSACTIONS) and waits
        # aiokafka's 20 ms before asking again, on every hop of a lightly loaded pipeline.
        sender_module.BACKOFF_OVERRIDE = CONCURRENT_TRANSACTIONS_BACKOFF_S
    if getattr(sender_module.Sender._do_txn_offset_commit, "_weir_group_member", False):
        return
    from aiokafka.producer.transaction_manager import TransactionManager

    TransactionManager.consumer_group_to_add = _early_group_to_add(TransactionManager.consumer_group_to_add)
    handler_class = _group_txn_offset_commit_handler()
    original = sender_module.Sender._do_txn_offset_commit

    async def _do_txn_offset_commit(self: Any, offsets: Any, group_id: str) -> Any:
        member = getattr(self._txn_manager, "weir_group_member", None)
        if member is None or not offsets:
            return await original(self, offsets, group_id)
        generation, member_id, group_instance_id = member()
        if generation < 0 or not member_id:
            # The consumer left its generation (it was removed from the group: a session timeout). The
            # coordinator would take transactional offsets of generation -1 from anyone, unchecked: this
            # worker's partitions may belong to another member already, so the transaction must abort.
            _refuse(self._txn_manager, f"not a member of {group_id} (generation {generation})")
            return None
        try:
            node_id = await self._find_coordinator(sender_module.CoordinationType.GROUP, group_id)
        except Errors.GroupAuthorizationFailedError as exc:
            self._txn_manager.error_transaction(exc)
            return None
        return await handler_class(self, offsets, group_id, (generation, member_id, group_instance_id)).do(node_id)

    _do_txn_offset_commit._weir_group_member = True  # type: ignore[attr-defined]
    sender_module.Sender._do_txn_offset_commit = _do_txn_offset_commit


async def wait_settled(consumer: Any, partitions: list[TopicPartition], log_every_s: float = 5.0) -> dict[TopicPartition, int]:
    """Wait until no transaction is open on ``partitions``: their last stable offset is their high watermark; return it.

    ``consumer`` is an aiokafka consumer; the last stable offsets and the high watermarks are asked of the broker
    together, on the consumer's coordination connections (:mod:`app.engine.offsets`).
    """
    if not partitions:
        return {}
    began = last_log = time.monotonic()
    while True:
        stable, high = await asyncio.gather(
            offsets.end_offsets(consumer, partitions, committed=True), offsets.end_offsets(consumer, partitions, committed=False)
        )
        open_on = sorted(tp for tp in partitions if stable[tp] < high[tp])
        if not open_on:
            return stable
        now = time.monotonic()
        if now - last_log >= log_every_s:
            last_log = now
            log.warning("waiting %.0f s for open transactions on %s to end before restoring them", now - began, open_on)
        await asyncio.sleep(0.05)
