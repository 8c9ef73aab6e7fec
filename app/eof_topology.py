"""An end-of-stream job (seed 000) compiled into its four stages: filter, controller, aggregator, joiner.

:class:`EofTopology` takes a :class:`tables.eof.EofJob` and a :class:`app.stages.Wiring`; a deployment may host several
jobs, each under a name of its own (its topics ``<prefix><name>.eof-batches``..., its tables ``<name>-eof_counters``...);
the unnamed one keeps the plain names (``<prefix>eof-batches``, ``eof_counters``). The state cores are in
:mod:`tables.eof`; each stage here decodes its messages, runs the core and applies the change through the keyed-state
runtime (:class:`ClientStates`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from faust.types import EventT

from weir.app.keyed_stage import KeyedLogic, Transition, keyed_stage
from weir.app.runtime.keyed import Change, Output, send_checked
from weir.app.settings import SettingError, load_named
from weir.app.shell import InvalidMessage
from weir.app.stages import Stage, Wiring, per_event
from weir.tables.eof import (
    ANSWERS_FILTER,
    TOPIC_AGGREGATE,
    TOPIC_BATCHES,
    TOPIC_COUNTER,
    TOPIC_JOIN,
    TOPIC_REPORTS,
    ClientJoin,
    ClientTotals,
    ControllerState,
    Emit,
    EofConfig,
    EofJob,
    Totals,
    filter_batch,
    is_count,
    on_aggregator_tick,
    on_batch,
    on_cleanup,
    on_controller_tick,
    on_delivered,
    on_finish,
    on_join_cleanup,
    on_joiner_tick,
    on_report,
    on_sent,
    on_side,
    on_totals,
    topic_base,
)

__all__ = ["EofTopology", "load_job", "parse_jobs", "topic_base"]


def load_job(spec: str, setting: str = "WEIR_EOF_JOB") -> EofJob:
    """Import the end-of-stream job named ``module:NAME``."""
    job: EofJob = load_named(setting, spec, "a tables.eof.EofJob", lambda found: isinstance(found, EofJob))
    return job


def parse_jobs(raw: str) -> list[tuple[str, str]]:
    """``WEIR_EOF_JOB``'s entries as (name, ``module:NAME``): ``module:NAME`` (the unnamed job, at most one) or
    ``name=module:NAME``, comma separated."""
    entries: list[tuple[str, str]] = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        name, _, spec = entry.rpartition("=")
        name = name.strip()
        if name and not all(char.isalnum() or char in "_-" for char in name):
            raise SettingError(f"setting WEIR_EOF_JOB={raw!r}: job name {name!r} may hold letters, digits, '_' and '-' only")
        entries.append((name, spec.strip()))
    names = [name for name, _ in entries]
    twice = sorted({name or "(unnamed)" for name in names if names.count(name) > 1})
    if twice:
        raise SettingError(f"setting WEIR_EOF_JOB={raw!r}: job(s) {twice} named twice (one unnamed job at most)")
    return entries


class _ClientState(Protocol):
    @property
    def closed_ms(self) -> int | None: ...

    def deadline_ms(self, config: EofConfig) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...


S = TypeVar("S", bound=_ClientState)
S_co = TypeVar("S_co", bound=_ClientState, covariant=True)


class _Transition(Protocol[S_co]):
    @property
    def state(self) -> S_co | None: ...

    @property
    def emits(self) -> list[Emit]: ...

    @property
    def rejected(self) -> str | None: ...


def _encode(state: _ClientState) -> Any:
    return state.to_dict()


def _count(message: dict[str, Any], field: str, client: str) -> int:
    value = message.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidMessage(f"eof controller: {message.get('kind')!r} of client {client!r} needs a non-negative integer {field!r}")
    return value


def _client_of(message: Any, stage: str) -> str:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof {stage}: a message must be a JSON object, got {type(message).__name__}")
    client = message.get("client")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof {stage}: 'client' must be a non-empty string, got {client!r:.60}")
    return client


def _parse_batch(message: Any) -> tuple[str, int, list[Any]]:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof filter: a batch must be a JSON object, got {type(message).__name__}")
    client, batch_id, lines = message.get("client"), message.get("batch_id"), message.get("lines")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof filter: 'client' must be a non-empty string, got {client!r:.60}")
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise InvalidMessage(f"eof filter: batch of client {client!r} needs a non-negative integer 'batch_id', got {batch_id!r:.60}")
    if not isinstance(lines, list):
        raise InvalidMessage(f"eof filter: batch {batch_id} of client {client!r} needs 'lines', a list (of the client's records)")
    return client, batch_id, lines


def _totals(message: dict[str, Any], client: str) -> Totals:
    batches, records, error = message.get("batches"), message.get("records"), message.get("error")
    if not (isinstance(batches, int) and isinstance(records, int) and is_count(batches) and is_count(records)) or not (
        "totals" in message and (error is None or isinstance(error, str))
    ):
        raise InvalidMessage(
            f"eof joiner: totals of client {client!r} need 'batches' and 'records' (non-negative integers below 2**53), "
            "'totals' (the job's) and 'error' (null or a string)"
        )
    return Totals(batches, records, message["totals"], error)


class EofTopology:
    """One end-of-stream job's topics, tables and four stages (``name``: its namespace, empty for the unnamed job)."""

    def __init__(self, job: EofJob, wiring: Wiring, *, name: str = "") -> None:
        self.job = job
        self.name = name
        self.settings = wiring.settings
        self.config = EofConfig(
            idle_timeout_ms=self.settings.eof_idle_timeout_ms, closed_retention_ms=self.settings.eof_closed_retention_ms
        )
        self.batches = wiring.topic_named(topic_base(name, TOPIC_BATCHES))
        self.counter = wiring.topic_named(topic_base(name, TOPIC_COUNTER))
        self.aggregate = wiring.topic_named(topic_base(name, TOPIC_AGGREGATE))
        self.join = wiring.topic_named(topic_base(name, TOPIC_JOIN))
        self.reports = wiring.topic_named(topic_base(name, TOPIC_REPORTS))
        #: where the cores' messages go: the pipeline's stages, and the job's own stages that keep per-client state
        self.targets: dict[str, Any] = {
            "aggregate": self.aggregate,
            "join": self.join,
            "reports": self.reports,
            **{topic: wiring.topic_named(topic) for topic in job.cleanup_topics},
        }
        self._wiring = wiring

    def _agent(self, stage: str) -> str:
        return f"{stage}:{self.name}" if self.name else stage

    def outputs(self, client: str, emits: list[Emit]) -> tuple[Output, ...]:
        """The core's messages as the runtime's outputs, keyed by the client (a job's cleanup: by its own key)."""
        return tuple(
            Output(
                self.targets[message.to], client if message.key is None else message.key, message.value, what=f"the {message.to} message"
            )
            for message in emits
        )

    def topics(self) -> list[Any]:
        return [self.batches, self.counter, self.aggregate, self.join, self.reports]

    def stages(self) -> list[Stage]:
        if self.job.answers == ANSWERS_FILTER:  # seed 000's task 1: the filter answers the gateway
            return [self.filter_stage(), self.controller_stage()]
        return [self.filter_stage(), self.controller_stage(), self.aggregator_stage(), self.joiner_stage()]

    # -- filter: runs the job's select on each record, forwards, splits or drops each batch, reports what it forwarded

    def filter_stage(self) -> Stage:
        """Reads a client's batches (keyed client/batch, so any filter worker may get any batch of a client)."""
        agent = self._agent("eof_filter")

        async def report(event: EventT[bytes], client: str, batch_id: int, *, forwarded: int, dropped: int) -> None:
            """The batch's report to the controller, in the same transaction as the forwarded batches and the batch's offset."""
            message = {"kind": "filtered", "client": client, "batch_id": batch_id, "forwarded": forwarded, "dropped": dropped}
            await send_checked(event, [Output(self.counter, client, message)], agent=agent, step="report")

        async def handle(event: EventT[bytes], message: Any) -> None:
            client, batch_id, lines = _parse_batch(message)
            outcome = filter_batch(batch_id, lines, self.job, self.settings.eof_max_batch_orders)
            # forwarded to the group-by/aggregate stage, or, when the filter answers, straight to the gateway
            to, kind = (self.reports, "part") if self.job.answers == ANSWERS_FILTER else (self.aggregate, "batch")
            batches = [
                Output(to, client, {"kind": kind, "client": client, "batch_id": out_id, "records": records})
                for out_id, records in outcome.forwarded
            ]
            # A forwarded batch too large for a record is dead-lettered here and not counted as forwarded: the
            # aggregator waits only for batches that exist.
            dead = await send_checked(event, batches, agent=agent, step="forward")
            await report(event, client, batch_id, forwarded=len(batches) - len(dead), dropped=len(outcome.dropped) + len(dead))

        async def owed(event: EventT[bytes], reason: str, error: str) -> None:
            """A batch that could not be filtered at all still gets its report (nothing forwarded), by its key ``client/batch``."""
            key = event.message.key.decode("utf-8", "replace") if event.message.key else ""
            client, _, batch = key.rpartition("/")
            if client and batch.isdigit():
                await report(event, client, int(batch), forwarded=0, dropped=0)

        handler = per_event(agent=agent, what="eof filter: batch", handler=handle, owed=owed)
        return Stage(agent.replace(":", "-"), (self.batches,), handler)

    # -- controller: counts a client's batches by id; tells the aggregator when the count is final; cleans up

    def controller_stage(self) -> Stage:
        """Reads the gateway's and the filters' counter messages, keyed by client."""
        job = self.job

        def sent(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            return on_sent(previous, client, _count(message, "batches", client), now, answers=job.answers)

        def filtered(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            batch_id, forwarded = _count(message, "batch_id", client), _count(message, "forwarded", client)
            return on_report(previous, client, batch_id, forwarded, now, answers=job.answers)

        def delivered(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            return on_delivered(previous, client, now, job)

        return self._client_stage(
            "controller",
            "count",
            self.counter,
            ControllerState.from_dict,
            lambda state, config, at: on_controller_tick(state, config, at, job),
            {"sent": sent, "filtered": filtered, "delivered": delivered},
            tables=(
                "eof_counters",
                "EOF controller, per client: batches the gateway sent, filter reports by batch id (batches forwarded), "
                "whether the aggregator was told to finish, and the tombstone of a cleaned-up client (value: "
                "tables.eof.ControllerState).",
            ),
            deadlines=("eof_counter_deadlines", "idle clients and tombstones to drop"),
        )

    # -- aggregator: the job's totals per client, merged once per batch id; flushed to the joiner when the count is final

    def aggregator_stage(self) -> Stage:
        """Reads forwarded batches, the controller's finish and cleanup, and ticks, keyed by client."""
        job = self.job

        def batch(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            batch_id = message.get("batch_id")
            if not isinstance(batch_id, str) or not batch_id:
                raise InvalidMessage(f"eof aggregator: batch of client {client!r} needs a string 'batch_id', got {batch_id!r:.60}")
            records = message.get("records")
            if not isinstance(records, list):
                raise InvalidMessage(f"eof aggregator: batch {batch_id!r} of client {client!r} needs 'records', a list")
            return on_batch(previous, client, batch_id, records, now, job)

        def finish(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            expected = message.get("expected")
            if not isinstance(expected, int) or isinstance(expected, bool) or expected < 0:
                raise InvalidMessage(f"eof aggregator: 'finish' of client {client!r} needs a non-negative integer 'expected'")
            return on_finish(previous, client, expected, now, job)

        def cleanup(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            return on_cleanup(previous, client, now)

        return self._client_stage(
            "aggregator",
            "merge",
            self.aggregate,
            ClientTotals.from_dict,
            on_aggregator_tick,
            {"batch": batch, "finish": finish, "cleanup": cleanup},
            tables=(
                "eof_totals",
                f"EOF aggregator, per client: the totals of job {job.name!r} over the batches merged so far (by batch id), "
                "whether the count is final, and the tombstone of a cleaned-up client (value: tables.eof.ClientTotals).",
            ),
            deadlines=("eof_totals_deadlines", "idle clients and tombstones to drop"),
        )

    # -- joiner: joins a client's totals with its side data into its report (the job's join)

    def joiner_stage(self) -> Stage:
        """Reads each client's side data, its totals, the controller's cleanup, and ticks, keyed by client."""
        job = self.job

        def side(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            if "side" not in message:
                raise InvalidMessage(
                    f"eof joiner: 'side' of client {client!r} needs 'side' (the client's side data, any JSON, null for none)"
                )
            return on_side(previous, client, message["side"], now, job)

        def totals(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            return on_totals(previous, client, _totals(message, client), now, job)

        def cleanup(previous: Any, client: str, message: dict[str, Any], now: int) -> Any:
            return on_join_cleanup(previous, client, now)

        return self._client_stage(
            "joiner",
            "join",
            self.join,
            ClientJoin.from_dict,
            on_joiner_tick,
            {"side": side, "totals": totals, "cleanup": cleanup},
            tables=(
                "eof_joins",
                f"EOF joiner, per client: the side data the gateway sent, the totals the aggregator flushed, whether the "
                f"report of job {job.name!r} went out, and the tombstone of a cleaned-up client (value: tables.eof.ClientJoin).",
            ),
            deadlines=("eof_joins_deadlines", "stray clients and tombstones to drop"),
        )

    def _client_stage(
        self,
        stage: str,
        step: str,
        topic: Any,
        decode: Callable[[Mapping[str, Any]], Any],
        on_tick: Callable[[Any, EofConfig, int], Any],
        kinds: Mapping[str, Callable[[Any, str, dict[str, Any], int], Any]],
        *,
        tables: tuple[str, str],
        deadlines: tuple[str, str],
    ) -> Stage:
        """A stage that keeps per-client state on ``topic`` (:func:`app.keyed_stage.keyed_stage`): each message's
        ``kind`` picks the core's transition for its client (``kinds``); a tick walks the clients' deadlines
        (``on_tick``). One deadline entry per client at a time, filed when the client appears or closes; a tick files
        it again when activity moved it. The tables are named after the job for a named job."""
        config = self.config

        def change(client: str, previous: Any, transition: _Transition[Any]) -> Change[Any]:
            state = transition.state
            filed: tuple[int, ...] = ()
            if state is not None and state != previous and (previous is None or previous.closed_ms != state.closed_ms):
                filed = (state.deadline_ms(config),)
            rejected = () if transition.rejected is None else (transition.rejected,)
            return Change(state=state, outputs=self.outputs(client, transition.emits), rejected=rejected, deadlines=filed)

        def on_message(core: Callable[[Any, str, dict[str, Any], int], Any]) -> Transition[Any]:
            return lambda previous, client, message, now: change(client, previous, core(previous, client, message, now))

        logic: KeyedLogic[Any] = KeyedLogic(
            name=self._agent(f"eof_{stage}"),
            key_of=lambda message, _record_key: _client_of(message, stage),
            on_message={kind: on_message(core) for kind, core in kinds.items()},
            encode=_encode,
            decode=decode,
            due_ms=lambda _kind, state: state.deadline_ms(config),
            on_deadline=lambda client, state, now: change(client, state, on_tick(state, config, now)),
            step=step,
            deadline_kind="client",
            label=f"eof {stage}",
        )
        prefix = f"{self.name}-" if self.name else ""
        index_help = f"Deadline index of the EOF {stage} (app.deadlines.DeadlineIndex): {deadlines[1]}."
        built, _ = keyed_stage(
            logic, self._wiring, source=topic, table=(prefix + tables[0], tables[1]), deadlines=(prefix + deadlines[0], index_help)
        )
        return built
