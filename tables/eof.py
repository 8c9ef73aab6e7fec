"""End-of-stream per client: the typed values of the controller, aggregator and joiner tables and their pure cores.

The protocol (seed 000). A gateway numbers a client's batches 0..N-1 and sends them to the filter stage,
then the client's side data to the joiner, then tells the controller "sent N". Filter workers run in
parallel; for every input batch they report to the controller how many batches they forwarded (0 when
they drop it, several when they split it), with deterministic ids ``<batch>.<k>``. The controller counts
reports *by batch id*, so a redelivered report is not counted twice. Once the reports cover batches
0..N-1 the number of batches reaching the group-by/aggregate stage is final: the controller sends it
"finish, expect M". The aggregator merges batches by id and, holding M of them, flushes the client's
totals to the joiner; the joiner joins them with the client's side data and sends the report to the
gateway. When the gateway has the report it says "delivered"; the controller broadcasts a cleanup to every
stage that keeps per-client state (:data:`CLIENT_STATE_STAGES`), and each drops the client's key, keeping
only a small tombstone for a retention period so that late duplicates are absorbed. A client idle for too
long is reported abandoned and cleaned up the same way.

What is filtered, merged and joined is the job's (:class:`EofJob`: ``select``, ``zero``/``merge``,
``join``), named by ``WEIR_EOF_JOB``; an example job (ice-cream order lines, scoops per flavour, priced by the
client's list) is ``examples.eof_orders:ORDERS``, outside the library.

No Kafka, no clock: every function takes the state and ``now_ms`` and returns the new state (``None``:
delete the key) and the messages to send.
"""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import orjson

__all__ = [
    "TOPIC_BATCHES",
    "TOPIC_COUNTER",
    "TOPIC_AGGREGATE",
    "TOPIC_JOIN",
    "TOPIC_REPORTS",
    "topic_base",
    "CLIENT_STATE_STAGES",
    "ANSWERS_JOINER",
    "ANSWERS_FILTER",
    "assemble_parts",
    "ReportDesk",
    "STATUS_COMPLETE",
    "STATUS_ABANDONED",
    "STATUS_EXPIRED",
    "STATUS_FAILED",
    "Dropped",
    "EofJob",
    "FilterOutcome",
    "filter_batch",
    "EofConfig",
    "Emit",
    "ControllerState",
    "ControllerTransition",
    "on_sent",
    "on_report",
    "on_delivered",
    "on_controller_tick",
    "BatchCounts",
    "BatchIds",
    "ClientTotals",
    "AggregatorTransition",
    "on_batch",
    "on_finish",
    "on_cleanup",
    "on_aggregator_tick",
    "cleanup_emits",
    "Totals",
    "ClientJoin",
    "JoinTransition",
    "on_side",
    "on_totals",
    "on_join_cleanup",
    "on_joiner_tick",
    "join_report",
    "describe",
    "is_count",
    "reference_report",
    "count_runs",
    "counts_of_runs",
    "id_runs",
    "ids_of_runs",
]

#: gateway -> filters, keyed ``<client>/<batch id>``: ``{"client", "batch_id", "lines"}``
TOPIC_BATCHES = "eof-batches"
#: gateway and filters -> controller, keyed by client: ``sent``, ``filtered``, ``delivered``, ticks
TOPIC_COUNTER = "eof-counter"
#: filters and controller -> group-by/aggregate stage, keyed by client: ``batch``, ``finish``, ``cleanup``, ticks
TOPIC_AGGREGATE = "eof-aggregate"
#: gateway, aggregator and controller -> joiner, keyed by client: ``side``, ``totals``, ``cleanup``, ticks
TOPIC_JOIN = "eof-join"
#: joiner and controller -> gateway, keyed by client: the client's report
TOPIC_REPORTS = "eof-reports"


def topic_base(job_name: str, base: str) -> str:
    """A job's topic name without the deployment's prefix: ``base`` for the unnamed job, else ``<job>.<base>``
    (a deployment may run several jobs: ``WEIR_EOF_JOB=name=module:NAME,...``)."""
    return f"{job_name}.{base}" if job_name else base


#: The stages that keep state per client (besides the controller itself), by the name their input goes to:
#: the cleanup is broadcast to each of them. Every one keys its table by client, like its input topic, so
#: the one message keyed by the client reaches the one partition that may hold the client's state.
CLIENT_STATE_STAGES: tuple[str, ...] = ("aggregate", "join")
#: :attr:`EofJob.answers`: the joiner sends the report (filter -> group-by/aggregate -> joiner -> gateway)
ANSWERS_JOINER = "joiner"
#: :attr:`EofJob.answers`: the filter sends what it keeps straight to the gateway (seed 000's task 1)
ANSWERS_FILTER = "filter"

STATUS_COMPLETE = "complete"
STATUS_ABANDONED = "abandoned"
#: finished, but the gateway never said it received the report
STATUS_EXPIRED = "expired"
#: the job's merge or join failed: the report carries the error
STATUS_FAILED = "failed"


# --------------------------------------------------------------------------------------------- the job


class Dropped(ValueError):
    """Raised by a job's ``select`` to drop a record, with the reason (any ``ValueError`` drops it too)."""


@dataclass(frozen=True)
class EofJob:
    """What a job does with its clients' records: the user's three steps of seed 000's pipeline.

    * ``select(record)``: the filter stage's step, per record the gateway sent (any JSON value): the record
      to forward (JSON-able), or raise :class:`Dropped` (any ``ValueError``) to drop it, with the reason;
    * ``zero()`` and ``merge(totals, record)``: the group-by/aggregate stage's fold. ``zero()`` is the totals
      of no record; ``merge`` returns the totals with one forwarded record more, and may change the
      ``totals`` it is given (the stage's own copy). Totals are JSON-able: they are stored in a table and
      sent to the joiner;
    * ``join(client, totals, side)``: the joiner's step: the report's fields (a JSON object) from the
      client's final totals and the side data the gateway sent for the client (None when it sent none).

    Each step runs again when its input is redelivered: deterministic, no side effects. A ``merge`` or
    ``join`` that raises does not lose the client: its report comes, with status ``failed`` and the error.

    ``cleanups(client)``: stages of one's own that keep a client's state under keys of their own, as
    ``(topic name, key)`` pairs (each topic named in ``cleanup_topics``, without the deployment's prefix); the
    controller's cleanup broadcast sends each one ``{"kind": "cleanup", "client"}``, besides the pipeline's
    own stages (:data:`CLIENT_STATE_STAGES`).
    """

    name: str
    select: Callable[[Any], Any]
    zero: Callable[[], Any]
    merge: Callable[[Any, Any], Any]
    join: Callable[[str, Any, Any], Mapping[str, Any]]
    cleanup_topics: tuple[str, ...] = ()
    cleanups: Callable[[str], Sequence[tuple[str, str]]] | None = None
    #: who answers the gateway: ``"joiner"`` (filter -> group-by/aggregate -> joiner), or ``"filter"``: the seed's
    #: task 1, where the filter sends what it keeps straight to the gateway (:meth:`answered_by_filter`)
    answers: str = ANSWERS_JOINER

    def __post_init__(self) -> None:
        if self.answers not in (ANSWERS_JOINER, ANSWERS_FILTER):
            raise ValueError(f"EofJob {self.name!r}: answers must be {ANSWERS_JOINER!r} or {ANSWERS_FILTER!r}, got {self.answers!r}")

    @classmethod
    def answered_by_filter(cls, name: str, select: Callable[[Any], Any]) -> EofJob:
        """A job whose filter answers the gateway (seed 000's task 1): the records ``select`` keeps go straight to the
        gateway as parts (``{"kind": "part", "batch_id", "records"}``), and the controller, once the count is final,
        tells the gateway how many parts to expect (``{"kind": "end", "expected"}``); the gateway's report holds every
        kept record, in batch order. No group-by, aggregate or joiner stage runs for it."""

        def unused(*_: Any) -> Any:
            raise RuntimeError(f"EofJob {name!r} is answered by its filter: it has no aggregate or join")

        return cls(name, select, unused, unused, unused, answers=ANSWERS_FILTER)

    @property
    def pipeline_stages(self) -> tuple[str, ...]:
        """The stages after the filter that keep per-client state (the cleanup goes to each)."""
        return CLIENT_STATE_STAGES if self.answers == ANSWERS_JOINER else ()


# --------------------------------------------------------------------------------------------- filter


# The per-message values below are slotted dataclasses, not frozen ones: nothing changes one once made, and a frozen
# dataclass's __init__ (object.__setattr__ per field) takes three times as long (see tables.aggregates.ItemOutcome).


@dataclass(slots=True)
class FilterOutcome:
    """What the filter does with one input batch: the batches it forwards (by id) and the records it drops."""

    forwarded: list[tuple[str, list[Any]]]
    dropped: list[tuple[int, str]]


def filter_batch(batch_id: int, records: list[Any], job: EofJob, max_batch_records: int) -> FilterOutcome:
    """Drop what the job's ``select`` refuses; forward the rest as one batch, several (split) or none.

    Deterministic: a redelivered batch forwards the same ids with the same contents. An exception other
    than ``ValueError`` from ``select`` is not a refusal: it escapes (the whole batch is the agent's error).
    """
    kept: list[Any] = []
    dropped: list[tuple[int, str]] = []
    for number, record in enumerate(records):
        try:
            kept.append(job.select(record))
        except ValueError as error:
            dropped.append((number, str(error) or type(error).__name__))
    chunks = [kept[start : start + max_batch_records] for start in range(0, len(kept), max_batch_records)]
    return FilterOutcome([(f"{batch_id}.{number}", chunk) for number, chunk in enumerate(chunks)], dropped)


# ------------------------------------------------------------------------------------ stored id sets

# A client's batch ids are stored as runs, not one by one: a client of N batches would otherwise write a value
# that grows with N at every batch, its changelog's bytes with N squared. Batches mostly come in order, so a
# client's ids are a few runs whatever N is.


def count_runs(counts: Mapping[int, int]) -> list[list[int]]:
    """``{batch: count}`` as runs ``[first, end, count]``: batches first..end-1 each with that count."""
    runs: list[list[int]] = []
    for batch in sorted(counts):
        count = counts[batch]
        if runs and runs[-1][1] == batch and runs[-1][2] == count:
            runs[-1][1] = batch + 1
        else:
            runs.append([batch, batch + 1, count])
    return runs


def counts_of_runs(raw: Any) -> dict[int, int]:
    """The counts of :func:`count_runs` (or of the older ``{"batch": count}`` form)."""
    return dict(BatchCounts.from_raw(raw).items())


def _run_at(runs: Sequence[tuple[int, ...]], batch: int) -> int:
    """The index of the last run of ``runs`` (sorted runs ``(first, end, ...)``) that starts at or before ``batch``; -1: none."""
    return bisect.bisect_right(runs, (batch, math.inf)) - 1


def _holds(runs: Sequence[tuple[int, ...]], batch: int) -> tuple[int, ...] | None:
    """The run of ``runs`` that holds ``batch``, or None."""
    at = _run_at(runs, batch)
    return runs[at] if at >= 0 and runs[at][0] <= batch < runs[at][1] else None


def _with_batch(runs: Sequence[tuple[int, ...]], batch: int, rest: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """``runs`` (sorted runs ``(first, end, *rest)``; touching runs differ in ``rest``) and ``batch`` (in none of
    them) with ``rest``: merged into the runs it touches that have the same ``rest``."""
    merged = list(runs)
    at = _run_at(merged, batch) + 1  # the first run after the batch
    joins_left = at > 0 and merged[at - 1][1] == batch and merged[at - 1][2:] == rest
    joins_right = at < len(merged) and merged[at][0] == batch + 1 and merged[at][2:] == rest
    if joins_left and joins_right:
        merged[at - 1 : at + 1] = [(merged[at - 1][0], merged[at][1], *rest)]
    elif joins_left:
        merged[at - 1] = (merged[at - 1][0], batch + 1, *rest)
    elif joins_right:
        merged[at] = (batch, merged[at][1], *rest)
    else:
        merged.insert(at, (batch, batch + 1, *rest))
    return tuple(merged)


CountRuns = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, eq=False)
class BatchCounts:
    """``{batch: count}`` held as runs (what :func:`count_runs` stores): reading, adding and storing one batch's
    count cost as much as there are runs, not batches. The controller adds one report per batch; held as a dict,
    every report re-sorted and re-encoded all of them. Equal to a dict of the same counts."""

    #: runs [first, end) of batches with one count each, sorted, not overlapping; touching runs differ in count
    runs: CountRuns = ()
    count: int = 0
    total: int = 0

    @classmethod
    def of(cls, counts: Mapping[int, int]) -> BatchCounts:
        runs = tuple((first, end, count) for first, end, count in count_runs(counts))
        return cls(runs, len(counts), sum(counts.values()))

    @classmethod
    def from_raw(cls, raw: Any) -> BatchCounts:
        """The counts :meth:`to_raw` stored (or the older ``{"batch": count}`` form)."""
        if isinstance(raw, Mapping):
            return cls.of({int(batch): int(count) for batch, count in raw.items()})
        runs = tuple((int(first), int(end), int(count)) for first, end, count in raw)
        return cls(runs, sum(end - first for first, end, _ in runs), sum((end - first) * count for first, end, count in runs))

    def to_raw(self) -> list[list[int]]:
        return [[first, end, count] for first, end, count in self.runs]

    def get(self, batch: int) -> int | None:
        run = _holds(self.runs, batch)
        return None if run is None else run[2]

    def first_from(self, batch: int) -> int | None:
        """The lowest batch at or above ``batch`` that has a count."""
        for first, end, _ in self.runs[max(0, _run_at(self.runs, batch)) :]:
            if end > batch:
                return max(first, batch)
        return None

    def with_count(self, batch: int, count: int) -> BatchCounts:
        """These counts and ``batch``'s (a batch not counted yet)."""
        runs = cast(CountRuns, _with_batch(self.runs, batch, (count,)))
        return BatchCounts(runs, self.count + 1, self.total + count)

    def items(self) -> Iterator[tuple[int, int]]:
        for first, end, count in self.runs:
            for batch in range(first, end):
                yield batch, count

    def __len__(self) -> int:
        return self.count

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchCounts):
            return self.runs == other.runs
        if isinstance(other, Mapping):
            return len(other) == self.count and all(isinstance(batch, int) and self.get(batch) == count for batch, count in other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.runs)


def id_runs(ids: Iterable[str]) -> dict[str, Any]:
    """Forwarded batch ids ``<batch>.<k>`` as runs of batches per ``k`` (``{"<k>": [[first, end], ...]}``); an id
    of another form is kept as it is, under ``"other"``."""
    return BatchIds.of(ids).to_raw()


def _split_id(batch_id: str) -> tuple[int, int] | None:
    """(batch, k) of an id ``<batch>.<k>`` made by the filter; None for an id of another form."""
    batch, dot, part = batch_id.partition(".")
    if dot and _is_number(batch) and _is_number(part):
        return int(batch), int(part)
    return None


Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, eq=False)
class BatchIds:
    """A set of batch ids held as runs (what :func:`id_runs` stores): adding an id, testing one and storing the
    set cost as much as the set has runs, not ids. A client's aggregate adds one id per batch; held as a set of
    strings, every batch re-encoded all of them (the aggregator's time grew with the square of a client's batches).
    Equal to another set of the same ids (a ``frozenset`` included)."""

    #: per ``k``, the runs [first, end) of batches, sorted, neither overlapping nor touching
    runs: tuple[tuple[int, Runs], ...] = ()
    #: ids of another form
    other: frozenset[str] = frozenset()
    count: int = 0

    @classmethod
    def of(cls, ids: Iterable[str]) -> BatchIds:
        by_part: dict[int, list[int]] = {}
        other: set[str] = set()
        for batch_id in ids:
            split = _split_id(batch_id)
            if split is None:
                other.add(batch_id)
            else:
                by_part.setdefault(split[1], []).append(split[0])
        runs = tuple(
            (part, tuple((first, end) for first, end, _ in count_runs(dict.fromkeys(batches, 0))))
            for part, batches in sorted(by_part.items())
        )
        return cls(runs, frozenset(other), sum(end - first for _, part_runs in runs for first, end in part_runs) + len(other))

    @classmethod
    def from_raw(cls, raw: Any) -> BatchIds:
        """The set :meth:`to_raw` stored (or the older list of ids)."""
        if not isinstance(raw, Mapping):
            return cls.of(str(batch_id) for batch_id in raw)
        runs = tuple(
            sorted(
                (int(part), tuple((int(first), int(end)) for first, end in part_runs)) for part, part_runs in raw.items() if part != "other"
            )
        )
        other = frozenset(str(batch_id) for batch_id in raw.get("other", ()))
        return cls(runs, other, sum(end - first for _, part_runs in runs for first, end in part_runs) + len(other))

    def to_raw(self) -> dict[str, Any]:
        stored: dict[str, Any] = {str(part): [[first, end] for first, end in part_runs] for part, part_runs in self.runs}
        if self.other:
            stored["other"] = sorted(self.other)
        return stored

    def _part(self, part: int) -> Runs:
        for number, part_runs in self.runs:
            if number == part:
                return part_runs
        return ()

    def __contains__(self, batch_id: object) -> bool:
        if not isinstance(batch_id, str):
            return False
        split = _split_id(batch_id)
        if split is None:
            return batch_id in self.other
        batch, part = split
        return _holds(self._part(part), batch) is not None

    def with_id(self, batch_id: str) -> BatchIds:
        """This set and ``batch_id``."""
        if batch_id in self:
            return self
        split = _split_id(batch_id)
        if split is None:
            return replace(self, other=self.other | {batch_id}, count=self.count + 1)
        batch, part = split
        runs = dict(self.runs)
        runs[part] = cast(Runs, _with_batch(self._part(part), batch))
        return replace(self, runs=tuple(sorted(runs.items())), count=self.count + 1)

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        for part, part_runs in self.runs:
            for first, end in part_runs:
                yield from (f"{batch}.{part}" for batch in range(first, end))
        yield from self.other

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchIds):
            return (self.runs, self.other) == (other.runs, other.other)
        if isinstance(other, (set, frozenset)):
            return len(other) == self.count and all(batch_id in self for batch_id in other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self))  # equal to the frozenset of its ids, so hashed as it (rarely asked: ids stay runs)


def _is_number(text: str) -> bool:
    """Digits 0-9 only, without a leading zero (ids are made with ``f"{batch}.{k}"``)."""
    return text.isascii() and text.isdigit() and (text[0] != "0" or text == "0")


def ids_of_runs(raw: Any) -> frozenset[str]:
    """The ids of :func:`id_runs` (or of the older list of ids)."""
    return frozenset(BatchIds.from_raw(raw))


# ----------------------------------------------------------------------------------------- controller


@dataclass(frozen=True)
class EofConfig:
    """Timeouts of the end-of-stream protocol."""

    idle_timeout_ms: int
    closed_retention_ms: int


@dataclass(slots=True)
class Emit:
    """A message to send: ``to`` is "aggregate", "join" or "reports" (keyed by the client), or a topic of the job's
    ``cleanup_topics`` (keyed by ``key``)."""

    to: str
    value: dict[str, Any]
    key: str | None = None


@dataclass(slots=True)
class ControllerState:
    """One client in table ``eof_counters``: batches the gateway sent, reports by batch id, progress."""

    client: str
    last_activity_ms: int
    sent_total: int | None = None
    #: batch id -> batches the filter forwarded for it (a dict given here is held as runs)
    reported: BatchCounts = BatchCounts()
    finish_sent: bool = False
    #: set once cleaned up: the key is a tombstone until ``closed_ms + closed_retention_ms``
    closed_ms: int | None = None
    outcome: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.reported, BatchCounts):
            object.__setattr__(self, "reported", BatchCounts.of(self.reported))

    @property
    def forwarded_total(self) -> int:
        return self.reported.total

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return self.last_activity_ms + config.idle_timeout_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "sent_total": self.sent_total,
            "reported": self.reported.to_raw(),
            "finish_sent": self.finish_sent,
            "closed_ms": self.closed_ms,
            "outcome": self.outcome,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ControllerState:
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            sent_total=raw.get("sent_total"),
            reported=BatchCounts.from_raw(raw.get("reported") or ()),
            finish_sent=bool(raw.get("finish_sent")),
            closed_ms=raw.get("closed_ms"),
            outcome=raw.get("outcome"),
        )


@dataclass(slots=True)
class ControllerTransition:
    """New state (None: delete the key), messages to send, and an error for the dead letters."""

    state: ControllerState | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def _fresh(previous: ControllerState | None, client: str, now_ms: int) -> ControllerState:
    return previous if previous is not None else ControllerState(client=client, last_activity_ms=now_ms)


def _maybe_finish(state: ControllerState, answers: str) -> ControllerTransition:
    """Once the reports cover every batch sent: the count is final. The aggregator is told how many batches to
    merge (``finish``), or, when the filter answers the gateway, the gateway how many parts to expect (``end``)."""
    if state.finish_sent or state.sent_total is None or len(state.reported) < state.sent_total:
        return ControllerTransition(state)
    counts = {"client": state.client, "expected": state.forwarded_total, "batches_sent": state.sent_total}
    if answers == ANSWERS_FILTER:
        return ControllerTransition(replace(state, finish_sent=True), [Emit("reports", {"kind": "end", **counts})])
    return ControllerTransition(replace(state, finish_sent=True), [Emit("aggregate", {"kind": "finish", **counts})])


def on_sent(
    previous: ControllerState | None, client: str, total: int, now_ms: int, *, answers: str = ANSWERS_JOINER
) -> ControllerTransition:
    """The gateway's end of a client: it sent ``total`` batches, numbered 0..total-1."""
    if previous is not None and previous.closed_ms is not None:
        return ControllerTransition(previous)  # late duplicate of a finished client
    state = _fresh(previous, client, now_ms)
    if state.sent_total is not None and state.sent_total != total:
        error = f"eof controller: client {client!r} was said to have sent {state.sent_total} batches, now {total}"
        return ControllerTransition(state, rejected=error)
    beyond = state.reported.first_from(total)
    if beyond is not None:
        error = f"eof controller: client {client!r} sent {total} batches (0..{total - 1}) but batch {beyond} was reported"
        return ControllerTransition(state, rejected=error)
    return _maybe_finish(replace(state, sent_total=total, last_activity_ms=max(state.last_activity_ms, now_ms)), answers)


def on_report(
    previous: ControllerState | None, client: str, batch_id: int, forwarded: int, now_ms: int, *, answers: str = ANSWERS_JOINER
) -> ControllerTransition:
    """A filter processed batch ``batch_id`` and forwarded ``forwarded`` batches for it."""
    if previous is not None and previous.closed_ms is not None:
        return ControllerTransition(previous)
    state = _fresh(previous, client, now_ms)
    known = state.reported.get(batch_id)
    if known is not None:
        if known != forwarded:
            error = f"eof controller: batch {batch_id} of client {client!r} was reported with {known} forwarded batches, now {forwarded}"
            return ControllerTransition(state, rejected=error)
        return ControllerTransition(state)  # a redelivered report
    if batch_id < 0 or forwarded < 0 or (state.sent_total is not None and batch_id >= state.sent_total):
        error = f"eof controller: report of batch {batch_id} (forwarded {forwarded}) for client {client!r} is outside 0..{state.sent_total}"
        return ControllerTransition(state, rejected=error)
    reported = state.reported.with_count(batch_id, forwarded)
    return _maybe_finish(replace(state, reported=reported, last_activity_ms=max(state.last_activity_ms, now_ms)), answers)


def _close(state: ControllerState, now_ms: int, outcome: str) -> ControllerState:
    """The client's tombstone: how it ended and when, nothing of its counts."""
    return ControllerState(client=state.client, last_activity_ms=now_ms, closed_ms=now_ms, outcome=outcome)


def cleanup_emits(client: str, job: EofJob | None = None) -> list[Emit]:
    """The cleanup broadcast: one ``cleanup`` to every stage that keeps state per client, the job's own included."""
    cleanup = {"kind": "cleanup", "client": client}
    emits = [Emit(stage, cleanup) for stage in (job.pipeline_stages if job is not None else CLIENT_STATE_STAGES)]
    if job is not None and job.cleanups is not None:
        emits += [Emit(topic, cleanup, key=key) for topic, key in job.cleanups(client)]
    return emits


def on_delivered(previous: ControllerState | None, client: str, now_ms: int, job: EofJob | None = None) -> ControllerTransition:
    """The gateway holds the client's report: every stage drops the client's keys."""
    if previous is None or previous.closed_ms is not None:
        return ControllerTransition(previous)
    return ControllerTransition(_close(previous, now_ms, STATUS_COMPLETE), cleanup_emits(client, job))


def on_controller_tick(state: ControllerState, config: EofConfig, now_ms: int, job: EofJob | None = None) -> ControllerTransition:
    """Drop an expired tombstone; report an idle client abandoned and clean it up."""
    if now_ms < state.deadline_ms(config):
        return ControllerTransition(state)
    if state.closed_ms is not None:
        return ControllerTransition(None)
    emits = cleanup_emits(state.client, job)
    if not state.finish_sent:
        report = {
            "client": state.client,
            "status": STATUS_ABANDONED,
            "batches_sent": state.sent_total,
            "batches_reported": len(state.reported),
            "idle_ms": now_ms - state.last_activity_ms,
        }
        emits.insert(0, Emit("reports", report))
    return ControllerTransition(_close(state, now_ms, STATUS_EXPIRED if state.finish_sent else STATUS_ABANDONED), emits)


# ---------------------------------------------------------------------------------- group-by/aggregate


@dataclass(slots=True)
class ClientTotals:
    """One client in table ``eof_totals``: the job's totals of the batches merged so far, by batch id."""

    client: str
    last_activity_ms: int
    #: the ids of the batches merged (a set of ids given here is held as runs)
    seen: BatchIds = BatchIds()
    #: records merged
    records: int = 0
    #: the job's totals (JSON); None until the first batch
    totals: Any = None
    expected: int | None = None
    flushed: bool = False
    #: why the job's ``merge`` failed (the totals stopped there; the report says ``failed``)
    error: str | None = None
    closed_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seen, BatchIds):
            object.__setattr__(self, "seen", BatchIds.of(self.seen))

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return _stray_deadline_ms(self.last_activity_ms, config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "seen": self.seen.to_raw(),
            "records": self.records,
            "totals": self.totals,
            "expected": self.expected,
            "flushed": self.flushed,
            "error": self.error,
            "closed_ms": self.closed_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClientTotals:
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            seen=BatchIds.from_raw(raw.get("seen") or ()),
            records=int(raw.get("records") or raw.get("orders") or 0),
            totals=raw.get("totals", _older_totals(raw)),
            expected=raw.get("expected"),
            flushed=bool(raw.get("flushed")),
            error=raw.get("error"),
            closed_ms=raw.get("closed_ms"),
        )


def _older_totals(raw: Mapping[str, Any]) -> Any:
    """The demo job's totals from a value written before jobs were pluggable (``orders`` and ``scoops`` fields)."""
    if "scoops" not in raw:
        return None
    return {"orders": int(raw.get("orders") or 0), "scoops": {str(flavour): int(n) for flavour, n in raw["scoops"].items()}}


def _stray_deadline_ms(last_activity_ms: int, config: EofConfig) -> int:
    # The controller cleans up an idle client (it hears of every batch a filter forwards, in the same
    # transaction). This only drops a stray client it never heard of, long after: expiring here a
    # client that waits for a late finish would lose its report.
    return last_activity_ms + 10 * config.idle_timeout_ms + config.closed_retention_ms


@dataclass(slots=True)
class AggregatorTransition:
    state: ClientTotals | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def _maybe_flush(state: ClientTotals, job: EofJob) -> AggregatorTransition:
    if state.flushed or state.expected is None or len(state.seen) < state.expected:
        return AggregatorTransition(state)
    totals, error = state.totals, state.error
    if totals is None and error is None:  # no batch came: the totals of nothing
        try:
            totals = _json_checked(job.zero())
        except Exception as failure:  # the job's code: the client's report says it failed
            error = f"zero failed: {describe(failure)}"
    flushed = Totals(batches=len(state.seen), records=state.records, totals=totals, error=error)
    return AggregatorTransition(
        replace(state, flushed=True), [Emit("join", {"kind": "totals", "client": state.client, **flushed.to_dict()})]
    )


T = TypeVar("T")


def _json_checked(value: T) -> T:
    """``value``, once it is known to encode as JSON (what the job returns is stored and sent as JSON)."""
    orjson.dumps(value)
    return value


def describe(error: BaseException) -> str:
    """An exception as one short line: its type and message."""
    text = str(error)
    return f"{type(error).__name__}: {text[:500]}" if text else type(error).__name__


def on_batch(
    previous: ClientTotals | None, client: str, batch_id: str, records: Iterable[Any], now_ms: int, job: EofJob
) -> AggregatorTransition:
    """Merge one forwarded batch into the client's totals with the job's ``merge``, once per batch id.

    A ``merge`` that raises stops the totals there: the batch still counts (the count stays final), the error
    is kept, and the flush carries it, so the client's report comes, ``failed``.
    """
    state = previous if previous is not None else ClientTotals(client=client, last_activity_ms=now_ms)
    if state.closed_ms is not None or batch_id in state.seen:
        return AggregatorTransition(state)  # a late or redelivered batch
    if state.flushed:
        error = f"eof aggregator: client {client!r} was flushed with {state.expected} batches, then batch {batch_id!r} arrived"
        return AggregatorTransition(state, rejected=error)
    if state.expected is not None and len(state.seen) >= state.expected:
        error = f"eof aggregator: client {client!r} expects {state.expected} batches, batch {batch_id!r} is one more"
        return AggregatorTransition(state, rejected=error)
    totals, count, failed = state.totals, 0, state.error
    if failed is None:
        try:
            totals = copy.deepcopy(totals) if totals is not None else job.zero()
            for record in records:
                totals = job.merge(totals, record)
                count += 1
            _json_checked(totals)  # stored in a table and sent to the joiner: a failure here is the job's, reported
        except Exception as error:  # the job's code: its failure is the client's, reported, not the worker's
            totals, count, failed = state.totals, 0, f"merge of batch {batch_id!r} failed: {describe(error)}"
    merged = replace(
        state, seen=state.seen.with_id(batch_id), records=state.records + count, totals=totals, error=failed, last_activity_ms=now_ms
    )
    return _maybe_flush(merged, job)


def on_finish(previous: ClientTotals | None, client: str, expected: int, now_ms: int, job: EofJob) -> AggregatorTransition:
    """The controller's word: ``expected`` batches will reach this client's aggregate, no more."""
    state = previous if previous is not None else ClientTotals(client=client, last_activity_ms=now_ms)
    if state.closed_ms is not None:
        return AggregatorTransition(state)
    if state.expected is not None and state.expected != expected:
        error = f"eof aggregator: client {client!r} was told to expect {state.expected} batches, now {expected}"
        return AggregatorTransition(state, rejected=error)
    if len(state.seen) > expected:
        error = f"eof aggregator: client {client!r} holds {len(state.seen)} batches, more than the {expected} expected"
        return AggregatorTransition(state, rejected=error)
    return _maybe_flush(replace(state, expected=expected, last_activity_ms=max(state.last_activity_ms, now_ms)), job)


def on_cleanup(previous: ClientTotals | None, client: str, now_ms: int) -> AggregatorTransition:
    """Drop the client's totals, keeping a tombstone that absorbs late batches for the retention."""
    if previous is not None and previous.closed_ms is not None:
        return AggregatorTransition(previous)
    return AggregatorTransition(ClientTotals(client=client, last_activity_ms=now_ms, closed_ms=now_ms))


def on_aggregator_tick(state: ClientTotals, config: EofConfig, now_ms: int) -> AggregatorTransition:
    if now_ms < state.deadline_ms(config):
        return AggregatorTransition(state)
    return AggregatorTransition(None)


# --------------------------------------------------------------------------------------------- joiner


@dataclass(slots=True)
class Totals:
    """What the group-by/aggregate stage flushes for a client: batches and records merged, the job's totals,
    and the error that stopped them (None: they are whole)."""

    batches: int
    records: int
    totals: Any
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "records": self.records, "totals": self.totals, "error": self.error}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Totals:
        error = raw.get("error")
        records = raw["records"] if "records" in raw else raw["orders"]  # the older form: the demo's orders and scoops
        return cls(int(raw["batches"]), int(records), raw.get("totals", _older_totals(raw)), None if error is None else str(error))


#: The largest count or price a message may carry: integers any JSON reader holds exactly.
MAX_EXACT = 2**53


def is_count(value: Any) -> bool:
    """A non-negative integer a JSON reader holds exactly (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_EXACT


@dataclass(slots=True)
class ClientJoin:
    """One client in table ``eof_joins``: the side data the gateway sent and the totals the aggregator flushed."""

    client: str
    last_activity_ms: int
    #: whether the gateway's side data came (it may be None itself)
    has_side: bool = False
    side: Any = None
    totals: Totals | None = None
    reported: bool = False
    closed_ms: int | None = None

    def deadline_ms(self, config: EofConfig) -> int:
        if self.closed_ms is not None:
            return self.closed_ms + config.closed_retention_ms
        return _stray_deadline_ms(self.last_activity_ms, config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "last_activity_ms": self.last_activity_ms,
            "has_side": self.has_side,
            "side": self.side,
            "totals": None if self.totals is None else self.totals.to_dict(),
            "reported": self.reported,
            "closed_ms": self.closed_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ClientJoin:
        totals = raw.get("totals")
        older_prices = raw.get("prices")  # the older form: the demo's price list, before side data
        return cls(
            client=str(raw["client"]),
            last_activity_ms=int(raw["last_activity_ms"]),
            has_side=bool(raw.get("has_side")) or older_prices is not None,
            side=raw.get("side", older_prices),
            totals=None if totals is None else Totals.from_dict(totals),
            reported=bool(raw.get("reported")),
            closed_ms=raw.get("closed_ms"),
        )


@dataclass(slots=True)
class JoinTransition:
    state: ClientJoin | None
    emits: list[Emit] = field(default_factory=list)
    rejected: str | None = None


def join_report(client: str, totals: Totals, side: Any, job: EofJob) -> dict[str, Any]:
    """The client's report: ``client``, ``status`` and ``batches``, then the fields of the job's
    ``join`` of its totals with its side data. Totals stopped by an error, or a ``join`` that raises or does
    not return an object, give a ``failed`` report with the ``error``: the client is answered all the same.
    """
    head = {"client": client, "status": STATUS_COMPLETE, "batches": totals.batches}
    if totals.error is not None:
        return {**head, "status": STATUS_FAILED, "error": totals.error}
    try:
        fields = job.join(client, totals.totals, side)
        if not isinstance(fields, Mapping):
            raise TypeError(f"join must return a mapping (the report's fields), got {type(fields).__name__}")
        return _json_checked({**{str(name): value for name, value in fields.items()}, **head})
    except Exception as error:  # the job's code: the client gets a failed report, the worker goes on
        return {**head, "status": STATUS_FAILED, "error": f"join failed: {describe(error)}"}


def _maybe_join(state: ClientJoin, job: EofJob) -> JoinTransition:
    if state.reported or not state.has_side or state.totals is None:
        return JoinTransition(state)
    return JoinTransition(replace(state, reported=True), [Emit("reports", join_report(state.client, state.totals, state.side, job))])


def _joining(previous: ClientJoin | None, client: str, now_ms: int) -> ClientJoin:
    return previous if previous is not None else ClientJoin(client=client, last_activity_ms=now_ms)


def on_side(previous: ClientJoin | None, client: str, side: Any, now_ms: int, job: EofJob) -> JoinTransition:
    """The gateway's side data for the client (one per client: the same again changes nothing)."""
    state = _joining(previous, client, now_ms)
    if state.closed_ms is not None:
        return JoinTransition(state)  # late duplicate of a finished client
    if state.has_side:
        if state.side != side:
            return JoinTransition(state, rejected=f"eof joiner: client {client!r} already has its side data, different data arrived")
        return JoinTransition(state)
    return _maybe_join(replace(state, has_side=True, side=side, last_activity_ms=max(state.last_activity_ms, now_ms)), job)


def on_totals(previous: ClientJoin | None, client: str, totals: Totals, now_ms: int, job: EofJob) -> JoinTransition:
    """The aggregator's totals for the client, flushed once its count was final (again: changes nothing)."""
    state = _joining(previous, client, now_ms)
    if state.closed_ms is not None:
        return JoinTransition(state)
    if state.totals is not None:
        if state.totals != totals:
            error = f"eof joiner: client {client!r} was flushed with {state.totals.batches} batches, then totals of {totals.batches} came"
            return JoinTransition(state, rejected=error)
        return JoinTransition(state)
    return _maybe_join(replace(state, totals=totals, last_activity_ms=max(state.last_activity_ms, now_ms)), job)


def on_join_cleanup(previous: ClientJoin | None, client: str, now_ms: int) -> JoinTransition:
    """Drop the client's side data and totals, keeping a tombstone that absorbs late messages for the retention."""
    if previous is not None and previous.closed_ms is not None:
        return JoinTransition(previous)
    return JoinTransition(ClientJoin(client=client, last_activity_ms=now_ms, closed_ms=now_ms))


def on_joiner_tick(state: ClientJoin, config: EofConfig, now_ms: int) -> JoinTransition:
    if now_ms < state.deadline_ms(config):
        return JoinTransition(state)
    return JoinTransition(None)


def reference_report(client: str, records: Iterable[Any], job: EofJob, side: Any = None) -> dict[str, Any]:
    """The report computed sequentially, without the protocol (what tests compare against); ``batches`` left out."""
    totals = job.zero()
    count = 0
    for record in records:
        try:
            selected = job.select(record)
        except ValueError:
            continue
        totals = job.merge(totals, selected)
        count += 1
    report = join_report(client, Totals(0, count, totals), side, job)
    del report["batches"]
    return report


def assemble_parts(client: str, parts: Mapping[str, Sequence[Any]], end: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report of a client whose filter answers the gateway (:meth:`EofJob.answered_by_filter`), once the parts
    ``end`` announces are all in: every kept record, in batch order (``<batch>.<k>`` numerically); None while parts
    are missing. Parts are held by batch id, so a redelivered one counts once."""
    expected = end.get("expected")
    if not isinstance(expected, int) or len(parts) < expected:
        return None

    def order(batch_id: str) -> tuple[int, int, str]:
        split = _split_id(batch_id)
        return (split[0], split[1], "") if split is not None else (math.inf, 0, batch_id)  # type: ignore[return-value]

    records = [record for batch_id in sorted(parts, key=order) for record in parts[batch_id]]
    return {
        "client": client,
        "status": STATUS_COMPLETE,
        "records": records,
        "record_count": len(records),
        "batches_sent": end.get("batches_sent"),
        "batches_forwarded": expected,
    }


class ReportDesk:
    """What a gateway reads on a job's reports topic, as client reports: the joiner's report (or the controller's
    ``abandoned``) as it comes; for a job answered by its filter, the filter's parts and the controller's end, held
    per client until :func:`assemble_parts` has them all. Shared by :class:`app.eof_gateway.Gateway` and the test
    driver."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[str, list[Any]]] = {}
        self._ends: dict[str, dict[str, Any]] = {}

    def take(self, message: Any) -> tuple[str, dict[str, Any]] | None:
        """(client, report) once ``message`` completes a client's report; None otherwise (or for a stray message)."""
        if not isinstance(message, dict) or not isinstance(message.get("client"), str):
            return None
        client, kind = message["client"], message.get("kind")
        if kind == "part":
            if not isinstance(message.get("batch_id"), str) or not isinstance(message.get("records"), list):
                return None
            self._parts.setdefault(client, {})[message["batch_id"]] = message["records"]
        elif kind == "end":
            self._ends[client] = message
        else:  # a report as it comes (a job's join may return a field named "kind" too): nothing of the client stays here
            self._parts.pop(client, None)
            self._ends.pop(client, None)
            return client, message
        end = self._ends.get(client)
        report = assemble_parts(client, self._parts.get(client, {}), end) if end is not None else None
        if report is None:
            return None
        del self._ends[client]
        self._parts.pop(client, None)
        return client, report
