"""Changelog restore under transactions: where a restore ends, and a local store rebuilt from the committed changelog only."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faust.types import TP

from weir.app.engine import fetcher, kip447, offsets
from weir.app.engine.config import installed

__all__ = [
    "changelog_ends",
    "end_restores_at_markers",
    "start_tables_at_once",
    "time_restores",
    "RestorePlan",
    "restore_plan",
    "RestoreObserver",
    "observe_restores",
    "wipe_local_tables",
]

log = logging.getLogger(__name__)


async def changelog_ends(consumer: Any, partitions: list[TP]) -> Mapping[TP, int]:
    """The end of each changelog partition to restore, from the broker (``WeirConsumerThread._highwaters``).

    ``consumer`` is the read_committed aiokafka consumer of the consumer thread: its ``end_offsets`` are the
    last stable offsets. With one transaction per worker, a changelog is restored only once no transaction is
    open on it (:func:`app.engine.kip447.wait_settled`).
    """
    if installed().worker_transaction is not None:
        # One transaction per worker: the changelog's previous owner may have left one open (killed), or
        # its commit markers may still be on their way here after its offsets became stable.
        return await kip447.wait_settled(consumer, partitions)
    return await offsets.end_offsets(consumer, partitions)


def end_restores_at_markers() -> None:
    """Make Faust's recovery see that a changelog partition whose tail is transaction markers is restored.

    Recovery ends a partition's restore once it has seen the record at its "highwater" (end offset - 1).
    Under transactions the last offset of a changelog is a commit (or abort) marker, which no fetch
    returns: Faust waited for two 5-second timeouts of its changelog queue before it looked at the fetch
    position ("Aborted tx until highwater"), so every restore of a non-empty changelog, at every
    rebalance and every restart, took 10 s more. Here a partition is restored as soon as the fetch
    position is past its highwater and every offset after the last record recovery saw was stepped over
    by the fetcher itself (:class:`~app.engine.fetcher.SkippedOffsets`: markers, aborted records): no record is on its way.
    """
    from faust.tables.recovery import Recovery

    if getattr(Recovery, "_weir_ends_at_markers", False):
        return
    original: Any = Recovery.need_recovery

    def need_recovery(self: Any) -> bool:
        if self.app.in_transaction:
            offsets = self.active_offsets
            for tp, highwater in list(self.active_highwaters.items()):
                seen = offsets.get(tp)
                if highwater is None or seen is None or seen >= highwater:
                    continue
                position = fetcher.fetch_position(self.app, tp)
                if (
                    position is not None
                    and position > highwater
                    and fetcher.skipped_offsets.covers(tp.topic, tp.partition, seen + 1, position)
                ):
                    offsets[tp] = highwater  # what Faust's own "Aborted tx until highwater" sets, 10 s later
        return bool(original(self))

    Recovery.need_recovery = need_recovery  # type: ignore[method-assign]
    Recovery._weir_ends_at_markers = True  # type: ignore[attr-defined]


def start_tables_at_once() -> None:
    """Start Faust's table manager without its one-second wait.

    ``TableManager.on_start`` sleeps 1 s before it registers the tables' changelogs and starts recovery, so that a
    table defined a moment late still makes it. weir's tables are all defined when the app module is imported,
    before the worker starts; the second was part of every worker's start, and of every restart's outage (a
    SIGKILLed worker's partitions wait for its successor). Replaces ``TableManager.on_start``: the same
    ``_update_channels`` and ``recovery.start()``, without the sleep.
    """
    from faust.tables.manager import TableManager

    if getattr(TableManager, "_weir_at_once", False):
        return

    async def on_start(self: Any) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()

    TableManager.on_start = on_start  # type: ignore[method-assign]
    TableManager._weir_at_once = True  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What a restore reads: changelog records, partitions, how many of these it resumes from a local copy, and how many
    of those were a standby replica's copy.

    A partition resumes from a local copy when reading starts past its beginning: the store held it up to that offset
    already, because this worker owned it and recorded at each commit how far its changelog was in the store
    (:func:`app.engine.commit.persist_changelog_positions`), or because a standby replica (``WEIR_STANDBY_REPLICAS``) kept it up
    to date from the changelog before it was taken over (``standby``: a partition this worker kept as a standby at some
    time). Only the records written since are read. Under exactly_once a worker's store is rebuilt from the changelog
    at start (:func:`wipe_local_tables`): a partition taken over with no copy is read from its beginning.
    """

    records: int
    partitions: int
    resumed: int
    standby: int = 0

    @property
    def from_beginning(self) -> int:
        """Partitions read from their beginning (no local copy)."""
        return self.partitions - self.resumed

    def __repr__(self) -> str:
        return (
            f"{self.records} changelog records in {self.partitions} partitions, {self.resumed} resumed from a local copy"
            f" ({self.standby} a standby's)"
        )


def restore_plan(starts: Mapping[TP, int], ends: Mapping[TP, int], standbys: Collection[TP] = ()) -> RestorePlan:
    """The plan of Faust's restore: ``starts`` the last offset already in the store (-1: none), ``ends`` the last
    offset to read (Faust's ``active_offsets`` and ``active_highwaters``), ``standbys`` the partitions this worker kept
    as a standby; partitions with nothing to read count not."""
    reading = {tp: (starts.get(tp, -1), end) for tp, end in ends.items() if end > starts.get(tp, -1)}
    resumed = [tp for tp, (start, _) in reading.items() if start >= 0]
    return RestorePlan(
        records=sum(end - start for start, end in reading.values()),
        partitions=len(reading),
        resumed=len(resumed),
        standby=sum(1 for tp in resumed if tp in standbys),
    )


#: Told of every restore of this worker's tables when it ends: the seconds from its start (the recovery that followed
#: a partition assignment) until the tables were up to date with their changelogs. For metrics: must not raise.
RestoreObserver = Callable[[float], None]
_restore_observers: list[RestoreObserver] = []


def observe_restores(observer: RestoreObserver) -> None:
    """Tell ``observer`` how long each restore took, from now on (once, however often it is passed)."""
    if observer not in _restore_observers:
        _restore_observers.append(observer)


def time_restores() -> None:
    """Time each restore from its start to its end, as Faust's recovery marks them, and tell the restore observers.

    Wraps ``faust.tables.recovery.Recovery._set_recovery_started`` and ``_set_recovery_ended``, which read and set
    ``in_recovery``. Faust marks a start twice per restore (before it asks the changelogs' ends, and again when
    there is something to read) and an end twice (when the changelogs are read, and when the restore completes);
    a restore here runs from the first start to the first end, so a restore that a new rebalance restarted counts
    once, with the time until the tables were up to date at last. A restore with nothing to read counts too (its
    time is the changelogs' ends asked of the broker).
    """
    from faust.tables.recovery import Recovery

    if getattr(Recovery, "_weir_timed", False):
        return
    started: Any = Recovery._set_recovery_started
    ended: Any = Recovery._set_recovery_ended

    def _set_recovery_started(self: Any) -> None:
        if not self.in_recovery:
            self._weir_restore_began = time.monotonic()
        # The second mark comes once where reading starts and ends is known, when there is something to read. It may
        # come with no restore open: Faust's changelog reader ends one between the marks whenever it finds nothing to
        # read (its ends not asked yet), and a restore then runs from the second mark to its end.
        standbys = self.__dict__.setdefault("_weir_standbys_kept", set())
        standbys.update(self.standby_tps)  # set by the rebalance before its first mark: every standby of this worker's life
        plan = restore_plan(self.active_offsets, self.active_highwaters, standbys) if self.need_recovery() else None
        self._weir_restore_plan = plan
        started(self)

    def _set_recovery_ended(self: Any) -> None:
        began = getattr(self, "_weir_restore_began", None) if self.in_recovery else None
        ended(self)
        if began is not None:
            self._weir_restore_began = None
            took = time.monotonic() - began
            plan = getattr(self, "_weir_restore_plan", None)
            log.info("tables restored in %.3f s%s", took, f": {plan!r}" if plan is not None else "")
            for observer in _restore_observers:
                observer(took)

    Recovery._set_recovery_started = _set_recovery_started  # type: ignore[method-assign]
    Recovery._set_recovery_ended = _set_recovery_ended  # type: ignore[method-assign]
    Recovery._weir_timed = True  # type: ignore[attr-defined]


def wipe_local_tables(tabledir: Path) -> None:
    """Drop local RocksDB files so that tables restore from the committed changelog only."""
    if tabledir.exists():
        log.info("exactly_once: local table files at %s are rebuilt from the changelog", tabledir)
        shutil.rmtree(tabledir)
