"""Exactly-once on faust-streaming 0.15 / aiokafka 0.14 / mode: the only code of weir that touches their internals.

Everything here is a workaround for what those libraries do not do (or do wrongly) under exactly_once;
weir's own rules live outside this package and use it through the names below. :func:`install` checks the
installed versions against :data:`TESTED_VERSIONS` first, then applies the patches, configured by an
:class:`EngineConfig` (nothing here is configured by setting a module global from outside).

Modules:

* :mod:`~app.engine.config`: :class:`EngineConfig`, the configuration :func:`install` was given;
* :mod:`~app.engine.commit`: the commit, as one sequence, each step with its reason; :class:`~app.engine.commit.CommitBudget`;
* :mod:`~app.engine.scopes`: the commit gate, and the batch, part and event scopes events are processed in;
* :mod:`~app.engine.overlay`: the table write overlay and the sends a scope collects (``WeirTable``, ``WeirTopic``);
* :mod:`~app.engine.produce`: a batch's sends and changelog records queued as record batches;
* :mod:`~app.engine.delivery`: the consumer (delivery loop, acks, commit handler) and per-event checks;
* :mod:`~app.engine.transactions`: transactions routed by source partition, per worker or per partition;
* :mod:`~app.engine.kip447`: KIP-447 (EOS v2) requests aiokafka lacks;
* :mod:`~app.engine.fetcher`: aiokafka's fetcher and subscription state (skipped offsets, positions, pauses);
* :mod:`~app.engine.restore`: where a changelog restore ends, and local stores rebuilt from the changelog;
* :mod:`~app.engine.streams`: an agent's batches (``batches``): from its inbox, or adaptive batches from a Faust stream (``take_ready``);
* :mod:`~app.engine.inbox`: the inboxes the delivery loop hands an agent's records to, past Faust's conductor, channel and Stream;
* :mod:`~app.engine.stores`: Faust's RocksDB store read by partition (the web views);
* :mod:`~app.engine.diagnostics`: the trace file and the consumer's state for ``kill -USR1``.

The patches, each with what it changes, the private names it relies on, and why:

faust (``faust.transport.drivers.aiokafka.Transport``'s ``TransactionManager``, ``Consumer`` and ``Producer``
are replaced by :func:`install`; ``App(Table=..., Topic=...)`` names the table and topic classes):

1. ``WeirTransactionManager`` (:mod:`~app.engine.transactions`, :mod:`~app.engine.commit`): every send made
   while an event is processed joins the transaction of the event's *source* partition, one transaction per
   worker or per source partition; the commit drains Faust's producer buffer and the deferred deliveries
   before it commits. Overrides ``_start_transactions``, ``_tps_to_transactional_ids``, ``send``, ``commit``;
   relies on Faust's aiokafka ``Producer._transaction_producers`` and ``_trn_locks`` and aiokafka's
   ``AIOKafkaProducer._txn_manager``. Why: Faust picks the transaction by the *destination* partition
   (faust-streaming/faust#517) and commits without draining its send buffer.
2. ``WeirConsumer`` (:mod:`~app.engine.delivery`): its own delivery loop (``_drain_messages``), acks that
   count only handled events (``ack``, ``_new_offset``), a commit before a rebalance (``on_partitions_revoked``),
   the commit gate around ``force_commit``, an idle-time commit handler (``_commit_handler``), rewinds after
   seeks (``seek``, ``perform_seek``), changelog partitions paused in aiokafka too (``pause_partitions``,
   ``resume_partitions``). Relies on Faust's ``Consumer._acked``, ``_acked_index``, ``_gap``,
   ``_committed_offset``, ``_read_offset``, ``_unacked_messages``, ``_buffered_partitions``, ``_n_acked``,
   ``_commit_every``, ``_wait_next_records``, ``_to_message``, ``_seek``, ``_is_changelog_tp``, ``_thread``,
   ``scheduler``, ``ack_lock``, ``consecutive_numbers``, ``CONSUMER_FETCHING``, and mode's ``Service._stopped``
   and ``Service.task``. Why: Faust's loop commits offsets past records no agent handled (batches fetched
   before a seek, paused partitions, acks of an older generation) and commits in the middle of events.
3. ``WeirConsumerThread`` (:mod:`~app.engine.delivery`, :mod:`~app.engine.restore`): overrides
   ``_create_worker_consumer`` (sets aiokafka's ``AIOKafkaConsumer._group_instance_id``: static membership, and
   ``_fetch_max_wait_ms``: Faust passes 1,500 ms),
   ``subscribe`` (waits until the broker lists every topic, through ``_ensure_consumer()._client``) and
   ``_highwaters`` (a changelog's end from the broker, after open transactions settled). Why: Faust took a
   taken-over changelog's end from the last fetch (-1: nothing restored), and a static member's first
   assignment missed topics created a moment before it joined.
4. ``WeirProducer`` (:mod:`~app.engine.transactions`): overrides ``_settings_extra`` (the transaction timeout)
   and ``_new_producer`` (attaches the consumer's group member, read from
   ``consumer._thread._ensure_consumer()._coordinator`` and its ``_group_instance_id``). Why: KIP-447.
5. ``WeirTable`` (:mod:`~app.engine.overlay`): a write-once overlay per scope over ``faust.Table``'s item
   methods; overrides ``send_changelog`` and ``_verify_source_topic_partitions``. Why: one changelog write
   per key per scope, awaited before the commit; Faust refused a fresh topic whose partition count the
   consumer's metadata did not know yet (0).
6. ``WeirTopic`` (:mod:`~app.engine.overlay`): overrides ``_get_producer`` and ``publish_message``. Why: sends
   are collected for the scope to await; Faust's ``maybe_start_producer`` yielded the loop three times per send.
7. ``part_scope`` (:mod:`~app.engine.scopes`) sets ``faust.streams._current_event``. Why: tables and sends of a
   batch's part use that part's partition and transaction.
8. ``faust.tables.recovery.Recovery.need_recovery`` is wrapped (:mod:`~app.engine.restore`); it reads and sets
   ``active_offsets`` / ``active_highwaters``. Why: a changelog ending in transaction markers took two
   5-second timeouts to be seen restored. ``Recovery._set_recovery_started`` and ``_set_recovery_ended`` are
   wrapped (``time_restores``; they read ``in_recovery``). Why: the restore time of /metrics (:mod:`app.metrics`).
   ``TableManager.on_start`` is replaced (``start_tables_at_once``: ``_update_channels``, ``recovery``). Why: it
   slept 1 s before every worker's restore, a second of every restart's outage.
9. ``take_ready`` (:mod:`~app.engine.streams`) uses ``Stream._enable_passive`` and ``Stream._processors``. Why:
   Faust's ``noack_take`` waits its timer even when no further event is ready.
10. The web views read Faust's RocksDB ``Store._dbs``, ``_visible_items``, ``_encode_key``, ``_decode_key``,
    ``_decode_value`` (:mod:`~app.engine.stores`). Why: a table's keys by partition (a view of what this
    worker owns), which the table's API does not give.
11. ``describe_consumer`` (:mod:`~app.engine.diagnostics`) reads ``Consumer._thread._consumer``,
    ``_active_partitions``, ``_paused_partitions``, ``_read_offset``, ``_committed_offset``, ``_acked``,
    ``_gap``. Why: a diagnostic (``kill -USR1``) only. ``committed_offsets`` (the same module) reads
    ``_committed_offset``. Why: the lag gauge of /metrics (:mod:`app.metrics`), without a request to the broker.

aiokafka:

12. ``aiokafka.consumer.fetcher.PartitionRecords.__init__`` / ``__next__`` are wrapped
    (:func:`~app.engine.fetcher.note_skipped_offsets`); they read ``_tp`` and ``next_fetch_offset``. Why: the
    delivery loop tells offsets the fetcher stepped over (markers, aborted records) from lost records.
13. The consumer client's ``_subscription`` (``pause``, ``resume``, ``is_assigned``,
    ``subscription.assignment.state_value``) and ``_fetcher._records`` (:mod:`~app.engine.fetcher`). Why:
    fetch positions for the rewinds, and paused changelog partitions not fetched (their buffered records
    stalled every fetch to the broker for 100 ms).
14. KIP-447 (:mod:`~app.engine.kip447`): ``Sender._do_txn_offset_commit`` replaced (TxnOffsetCommit v3 with
    the group's generation; relies on ``Sender._txn_manager``, ``_find_coordinator``,
    ``TxnOffsetCommitHandler``), ``TransactionManager.consumer_group_to_add`` wrapped (the group added
    early; ``_txn_consumer_group``, ``_txn_partitions``), a refused commit fails the transaction
    (``error_transaction``, ``_transaction_waiter``); per worker only, ``GroupCoordinator._do_fetch_commit_offsets``
    replaced (OffsetFetch v7, ``require_stable``; ``_send_req``) and ``sender.BACKOFF_OVERRIDE`` set to 5 ms;
    ``wait_settled`` asks offsets through :mod:`~app.engine.offsets`. Why: aiokafka 0.14 sends TxnOffsetCommit v0
    and OffsetFetch up to v3, neither of which carries what one transaction per worker needs to stay exactly-once.

15. Offsets (:mod:`~app.engine.offsets`): ``ListOffsets`` for recovery (``WeirConsumerThread.earliest_offsets``,
    ``_highwaters``, ``wait_settled``) goes through a copy of the consumer's ``_fetcher`` with ``_isolation_level``
    and ``_client`` replaced, sent with ``client.send(..., group=ConnectionGroup.COORDINATION)``; reads
    ``_request_timeout_ms``. Why: on the consumer's own connection each one waited up to 1.5 s behind a fetch, and a
    restarted worker asked four before it restored its tables.

16. Inboxes (:mod:`~app.engine.inbox`, ``EngineConfig.direct_batches``): the delivery loop puts an agent's
    records in its inbox instead of calling the conductor's callback; relies on ``Stream.channel``, ``Topic.topics``,
    ``pattern``, ``key_serializer`` / ``value_serializer``, ``app.agents`` and each agent's ``channel``, iterating the
    channel once (``Topic.__aiter__`` adds it to the conductor: the subscription), ``app.conf.Event``, and
    ``Monitor.stream_inbound_time``. Why: four layers per record (conductor, channel queue, Stream iterator, the
    batching processor) cost more than the agent's own work on the record.
17. A scope's RocksDB table writes (``WeirTable._write_out_direct``, :func:`~app.engine.overlay.send_changelogs`) use
    ``faust.stores.rocksdb.Store._encode_key``, ``_encode_value``, ``_set``, ``_contains``, ``_del``, the table's
    ``_should_expire_keys``, ``use_partitioner``, ``_verify_source_topic_partitions`` and
    ``app.tables.persist_offset_on_commit``. Why: Faust's ``send_soon`` per changelog record (a future message, the
    producer's buffer and its task, callbacks) cost more than the write.

mode: ``Service.task``, ``wait_first``, ``wait_for_stopped``, ``itertimer`` and the private ``_stopped`` event of
the consumer and the fetcher (:mod:`~app.engine.delivery`); the consumer's ``WorkerThread`` is a daemon thread
(``DaemonWorkerThread``). Why: a failed stop of that thread kept a crashed worker's process alive for good.

18. ``faust.app.base.App.crash`` is wrapped (:mod:`~app.engine.exits`): a crash arms a timer that ends the process
    if it is still alive 15 s later. Why: a crash during a rebalance after a broker outage left the worker running,
    its commits refused, holding its partitions for good.
19. ``faust.app.base.App._stop_consumer`` is wrapped (:func:`~app.engine.delivery.commit_before_stop`): an orderly
    stop commits what was handled and holds the gate before Faust revokes the tables. Why: events processed during
    Faust's stop had their outputs committed without their offsets, and a worker started after a SIGTERM sent them
    again.
20. A batch's sends and changelog records go out as record batches (:mod:`~app.engine.produce`): aiokafka's
    ``BatchBuilder`` and ``AIOKafkaProducer.send_batch``, the producer's queued batch of a partition
    (``_message_accumulator._batches``, ``MessageBatch._builder`` and ``future``, ``BatchBuilder._relative_offset``),
    ``_partition``, ``_txn_manager``, ``client._wait_on_metadata``. Why: a ``send()`` per record through Faust's
    producer (a coroutine, a lock, a future, the partitioner per record), and the small produce requests it made,
    cost half of an inline splitter's CPU per order.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping

from faust.transport.drivers import aiokafka as aiokafka_driver

from weir.app.engine import config as _config
from weir.app.engine import delivery, exits, fetcher, kip447, restore
from weir.app.engine.commit import observe_aborts, observe_commits
from weir.app.engine.config import EngineConfig, worker_slot
from weir.app.engine.delivery import WeirConsumer, ack_handled_all, first_delivery, forget_delivery, to_process
from weir.app.engine.diagnostics import committed_offsets, describe_consumer, trace, tracing
from weir.app.engine.overlay import WeirTable, WeirTopic, send_record
from weir.app.engine.restore import observe_restores, wipe_local_tables
from weir.app.engine.scopes import batch_scope, gate, part_scope
from weir.app.engine.stores import by_partition, partition_get, partition_items
from weir.app.engine.streams import batches, take_ready
from weir.app.engine.transactions import WeirProducer, WeirTransactionManager

__all__ = [
    "TESTED_VERSIONS",
    "check_versions",
    "EngineConfig",
    "install",
    "WeirTable",
    "WeirTopic",
    "send_record",
    "gate",
    "batch_scope",
    "part_scope",
    "to_process",
    "first_delivery",
    "forget_delivery",
    "ack_handled_all",
    "trace",
    "tracing",
    "describe_consumer",
    "committed_offsets",
    "observe_commits",
    "observe_aborts",
    "observe_restores",
    "take_ready",
    "batches",
    "by_partition",
    "partition_items",
    "partition_get",
    "wipe_local_tables",
    "worker_slot",
]

#: The distributions whose internals this package relies on, at the versions it was written and tested against.
TESTED_VERSIONS: Mapping[str, str] = {
    "faust-streaming": "0.15.3",
    "aiokafka": "0.14.0",
    "mode-streaming": "0.7.1",
}


def check_versions(tested: Mapping[str, str] = TESTED_VERSIONS, installed: Callable[[str], str] = importlib.metadata.version) -> None:
    """Raise RuntimeError, naming the installed and the tested version, when a distribution of ``tested`` differs."""
    mismatches = []
    for distribution, version in tested.items():
        try:
            found: str | None = installed(distribution)
        except importlib.metadata.PackageNotFoundError:
            found = None
        if found != version:
            have = f"{distribution} {found} is installed" if found is not None else f"{distribution} is not installed"
            mismatches.append(f"{have}, but app.engine was tested with {distribution} {version}")
    if mismatches:
        message = "; ".join(mismatches) + ": its patches rely on private names of that version (see the app.engine docstring)"
        raise RuntimeError(message)


def install(config: EngineConfig) -> None:
    """Check the versions, then make every Faust app in this process run weir's exactly-once machinery with ``config``.

    Replaces the aiokafka transport's transaction manager, consumer and producer (patches 1 to 4 above), and
    patches aiokafka (12, 14) and Faust's recovery (8). ``config.worker_transaction`` set: one transaction per
    worker (KIP-447), and committed-offset fetches wait for open transactions. Idempotent.
    """
    check_versions()
    _config._install(config)
    aiokafka_driver.Transport.TransactionManager = WeirTransactionManager
    aiokafka_driver.Transport.Consumer = WeirConsumer
    aiokafka_driver.Transport.Producer = WeirProducer
    kip447.install(per_worker=config.worker_transaction is not None)
    fetcher.note_skipped_offsets()
    restore.end_restores_at_markers()
    restore.time_restores()
    restore.start_tables_at_once()
    exits.exit_after_crash()
    delivery.commit_before_stop()
