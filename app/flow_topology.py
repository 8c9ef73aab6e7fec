"""Flows compiled into stages: one per flow (its source and resume topics), one per barrier, two per split.

:class:`FlowTopology` compiles a list of :class:`app.flows.Flow` with a :class:`app.stages.Wiring` (a settings value,
and how topics and tables are declared) into :class:`app.stages.Stage` values. A worker serves them as Faust agents
(``agents/flows.py``); the test driver (:mod:`app.testing`) runs them in process, on the same code.

Each barrier has a topic keyed by correlation key that carries arrivals of waiting exchanges, completions of
awaited flows and ticks, and a table keyed the same way: waits and completions of one key meet on one partition,
owned by one worker at a time, whichever process that is.

A split sends its items (in chunks) to the topic ``flow.<flow>.<split>.items``, where a stage of the flow runs the
process steps up to the aggregate on each item, and their outcomes to ``flow.<flow>.<aggregate>.results``, keyed by
correlation id, where another merges them into a table (``app.aggregation``, the same code as the foundation's
splitter, items and aggregator). The group's ``open`` carries the exchange as it was before the split; when the
group completes, the exchange goes on with the merged result as its payload, on the flow's resume topic.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.types import EventT

from weir.app import metrics
from weir.app.aggregation import Aggregation, ItemWorker, outline_of, send_split, split_messages
from weir.app.codec import dumps
from weir.app.errors import StepOutcome, dead_letter_record, describe_error, fitted_dead_letter, run_with_retry
from weir.app.flows import FAIL_PARENT, Await, Barrier, Exchange, Flow, FlowGraphError, KeyExpr, Segment, Step, validate_flows
from weir.app.keyed_stage import KeyedLogic, handled_event, keyed_stage
from weir.app.runtime.keyed import Change, KeyedState, Output, send_checked
from weir.app.settings import load_declarations
from weir.app.shell import InvalidMessage, dead_lettered, message_headers, now_ms, record_limit, send_dead_letter_record
from weir.app.stages import Stage, Wiring, per_event
from weir.app.windows import Window, WindowTopology
from weir.tables.aggregates import CONTINUE_ON_FAILURE, FAILED_STATUS, ITEM_FAILED
from weir.tables.barrier import (
    COMPLETED,
    FAILED,
    BarrierState,
    BarrierTransition,
    Failure,
    Relay,
    Waiting,
    on_arrival,
    on_completion,
    on_forwarded,
    on_relay,
    on_tick,
    reported,
)

__all__ = ["FlowTopology", "load_flows"]

log = logging.getLogger(__name__)


def load_flows(module_names: str) -> list[Flow]:
    """The ``FLOWS`` lists of the modules ``module_names`` names (``WEIR_FLOWS``: one module, or several comma separated),
    together: their flows may await each other."""
    found: list[Flow] = load_declarations("WEIR_FLOWS", module_names, "FLOWS", Flow, "flows")
    return found  # checked together by FlowTopology (validate_flows): unique names and sources, no cycle of waits


@dataclass
class AwaitedBy:
    """A barrier that awaits this flow, and how it reads its key from this flow's exchanges."""

    barrier: Barrier
    key_of: Any  # KeyExpr
    awaited: Await

    def part_of(self, exchange: Exchange, exchange_id: str) -> str | None:
        """A counted await: which execution this is (``distinct_by``, else the execution's id); None otherwise."""
        if self.awaited.count is None:
            return None
        return self.awaited.distinct_by(exchange) if self.awaited.distinct_by is not None else exchange_id


@dataclass
class CompiledFlow:
    flow: Flow
    source: faust.TopicT
    resume: faust.TopicT
    outcomes: faust.TopicT
    awaited_by: list[AwaitedBy] = field(default_factory=list)


@dataclass
class CompiledBarrier:
    barrier: Barrier
    owner: str
    topic: faust.TopicT
    #: how long a completion of each awaited flow is remembered (the longest timeout awaiting that flow)
    remember_ms: dict[str, int] = field(default_factory=dict)
    #: the barrier's keyed stage (:meth:`FlowTopology._barrier_logic`), and its keys' states
    stage: Stage | None = None
    keyed: KeyedState[BarrierState] | None = None


@dataclass
class CompiledSegment:
    """A split and its aggregate: where the items go, where their outcomes go, and the stages that handle them."""

    flow: CompiledFlow
    segment: Segment
    items: faust.TopicT
    results: faust.TopicT
    worker: ItemWorker
    aggregation: Aggregation


@dataclass
class CompiledAggregate:
    """An aggregate that groups exchanges by key (no split before it): where the exchanges go, and the stage."""

    flow: CompiledFlow
    index: int
    results: faust.TopicT
    aggregation: Aggregation


@dataclass
class CompiledWindow:
    """A window step: its flow, its place in it, the topic of its records, and the window its stage runs."""

    flow: CompiledFlow
    index: int
    records: Any
    window: Window


def _on_payload(fold: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A window step's fold on its records (``{"payload", "ts"}``): the user's fold on the payload."""

    def on_record(aggregate: Any, record: Any) -> Any:
        return fold(aggregate, record["payload"])

    return on_record


def _window_name(flow: str, step: str) -> str:
    """The window (its agent ``window-<name>`` and tables) of a flow's window step: letters, digits, '_' and '-'."""
    return "".join(char if char.isalnum() or char in "_-" else "_" for char in f"flow-{flow}-{step}")


def _any_async(steps: Iterable[Step]) -> bool:
    """Whether any of these steps is a coroutine function (its items may then run at once)."""
    return any(asyncio.iscoroutinefunction(step.function) for step in steps)


def _exchange_from_event(event: EventT[bytes], body: Any) -> Exchange:
    headers = {name: value.decode("utf-8", "replace") for name, value in message_headers(event)}
    raw_key = event.message.key
    key = raw_key.decode("utf-8", "replace") if isinstance(raw_key, bytes) else None
    return Exchange(payload=body, headers=headers, key=key)


class FlowTopology:
    """A list of flows compiled into stages: topics, tables and handlers, with no agent yet.

    ``runs``: the flows whose stages this process runs (all by default); every flow is compiled, so that outcomes
    reach the barriers of flows running elsewhere. ``wiring`` declares its topics and tables.
    """

    def __init__(self, flows: Sequence[Flow], wiring: Wiring, *, runs: Iterable[str] = ()) -> None:
        settings = wiring.settings
        self.settings = settings
        self.wiring = wiring
        self.declare_topic = wiring.topic
        self.declare_table = wiring.table
        self.dead_letters = wiring.dead_letters
        self.retry_policy = settings.retry_policy()
        self.declared = list(flows)
        self.by_source = validate_flows(self.declared)
        chosen = sorted(set(runs))
        unknown = sorted(set(chosen) - {flow.name for flow in self.declared})
        if unknown:
            declared = [flow.name for flow in self.declared]
            raise FlowGraphError(f"WEIR_FLOWS_RUN names flow(s) {unknown} that the flows do not declare; they are {declared}")
        #: the flows this process runs
        self.runs = frozenset(chosen or [flow.name for flow in self.declared])
        self._topics: dict[str, Any] = {}
        self.flows: dict[str, CompiledFlow] = {
            flow.name: CompiledFlow(
                flow, self._topic(flow.source), self._topic(f"flow.{flow.name}.resume"), self._topic(f"flow.{flow.name}.outcomes")
            )
            for flow in self.declared
        }
        self.barriers: dict[str, CompiledBarrier] = {}
        #: every barrier's topic (outcomes of the flows here go to barriers of flows that may run elsewhere)
        self.barrier_topics: dict[str, Any] = {}
        self.segments: dict[tuple[str, int], CompiledSegment] = {}
        self.correlating: dict[tuple[str, int], CompiledAggregate] = {}
        self._compile_barriers()
        self._compile_aggregates()
        self.windowed: dict[str, CompiledWindow] = {}
        self.windows = self._compile_windows(wiring)
        for flow in self.declared:  # declared now, so that a worker creates them at start
            for step in flow.steps:
                if step.kind == "to" and step.topic:
                    self._topic(step.topic)

    def _topic(self, name: str) -> Any:
        """The topic ``name`` (the settings' prefix added), declared once."""
        full = self.settings.topic(name)
        if full not in self._topics:
            self._topics[full] = self.declare_topic(full)
        return self._topics[full]

    def _compile_barriers(self) -> None:
        for flow in self.declared:
            for barrier in flow.barriers():
                self.barrier_topics[barrier.name] = self._topic(f"barrier.{barrier.name}")
                for awaited in barrier.awaits:
                    target = self.flows[self.by_source[awaited.source].name]
                    target.awaited_by.append(AwaitedBy(barrier, barrier.key_for(awaited), awaited))
                if flow.name not in self.runs:
                    continue  # its table and agent live with its flow
                compiled = CompiledBarrier(barrier=barrier, owner=flow.name, topic=self.barrier_topics[barrier.name])
                compiled.stage, compiled.keyed = keyed_stage(
                    self._barrier_logic(compiled),
                    self.wiring,
                    source=compiled.topic,
                    table=(
                        f"barrier-{barrier.name}",
                        f"Barrier {barrier.name!r} of flow {flow.name!r}: per key, the exchanges waiting and the completions "
                        "remembered (value: tables.barrier.BarrierState).",
                    ),
                    deadlines=(
                        f"barrier-{barrier.name}-deadlines",
                        f"Deadline index of barrier {barrier.name!r} (app.deadlines.DeadlineIndex).",
                    ),
                )
                self.barriers[barrier.name] = compiled
        for compiled in self.barriers.values():
            for awaited in compiled.barrier.awaits:
                target_name = self.by_source[awaited.source].name
                compiled.remember_ms[target_name] = max(entry.barrier.timeout_ms for entry in self.flows[target_name].awaited_by)

    def _compile_aggregates(self) -> None:
        for compiled in self.running():
            flow_name = compiled.flow.name
            for segment in compiled.flow.segments():
                split_step = compiled.flow.steps[segment.split_index]
                aggregate_step = compiled.flow.steps[segment.aggregate_index]
                assert aggregate_step.aggregate is not None
                results = self._topic(f"flow.{flow_name}.{aggregate_step.name}.results")
                self.segments[(flow_name, segment.split_index)] = CompiledSegment(
                    flow=compiled,
                    segment=segment,
                    items=self._topic(f"flow.{flow_name}.{split_step.name}.items"),
                    results=results,
                    worker=ItemWorker(
                        agent=f"flow:{flow_name}:{split_step.name}",
                        step=self._segment_steps(compiled, segment),
                        results=results,
                        # An async step may wait on I/O: a message's items then run at once, as the pipeline's items stage does.
                        concurrent=_any_async(compiled.flow.steps[index] for index in segment.item_steps),
                        # stop / fail-parent: a chunk's items after a failed one are not run (sequential stopOnException)
                        stop_on_failure=aggregate_step.aggregate.on_item_failure != CONTINUE_ON_FAILURE,
                        concurrency=self.settings.item_concurrency,
                        bundle=self.settings.bundle,
                        policy=self.retry_policy,
                    ),
                    aggregation=self._aggregation(compiled, aggregate_step, results),
                )
            for index in compiled.flow.correlation_aggregates():
                step = compiled.flow.steps[index]
                results = self._topic(f"flow.{flow_name}.{step.name}.results")
                self.correlating[(flow_name, index)] = CompiledAggregate(
                    compiled, index, results, self._aggregation(compiled, step, results)
                )

    def _compile_windows(self, wiring: Wiring) -> WindowTopology:
        """Each window step of the flows run here: its records topic and a :class:`app.windows.Window` on it whose
        results resume the flow after the step, as new executions."""
        for compiled in self.running():
            flow_name = compiled.flow.name
            for index, step in enumerate(compiled.flow.steps):
                if step.window is None:
                    continue
                source = f"flow.{flow_name}.{step.name}.records"
                window = Window(
                    name=_window_name(flow_name, step.name),
                    source=source,
                    to=f"flow.{flow_name}.resume",
                    spec=step.window.spec,
                    initial=step.window.initial,
                    fold=_on_payload(step.window.fold),
                    timestamp=lambda record: record["ts"],
                    emit="final" if step.window.emit == "final" else "update",
                    merge=step.window.merge,
                )
                self.windowed[window.name] = CompiledWindow(compiled, index, self._topic(source), window)
        return WindowTopology([entry.window for entry in self.windowed.values()], wiring, results=self._window_result)

    def _window_result(self, window: Window, key: str, result: dict[str, Any]) -> Output:
        """A window's result starts an execution of its flow after the window step, keyed by the window's key."""
        entry = self.windowed[window.name]
        compiled, step = entry.flow, entry.flow.flow.steps[entry.index]
        exchange = Exchange(payload=result, key=key)
        exchange_id = f"{compiled.flow.name}:{step.name}:{key}@{result['start_ms']}" + ("" if result["final"] else f"#{result['count']}")
        meta = self._execution_meta(compiled, exchange, exchange_id)
        resume = {"exchange": exchange.to_dict(), "meta": meta, "resume_step": entry.index + 1}
        return Output(compiled.resume, key, resume, what=f"the result of window {step.name!r}")

    def running(self) -> list[CompiledFlow]:
        """The compiled flows this process runs."""
        return [compiled for compiled in self.flows.values() if compiled.flow.name in self.runs]

    def all_topics(self) -> list[Any]:
        """Every topic the flows read or write (created at worker start)."""
        found = [topic for compiled in self.flows.values() for topic in (compiled.source, compiled.resume, compiled.outcomes)]
        found += [topic for segment in self.segments.values() for topic in (segment.items, segment.results)]
        found += [aggregate.results for aggregate in self.correlating.values()]
        found += [entry.records for entry in self.windowed.values()]
        found += list(self.barrier_topics.values())
        found += [self._topic(step.topic) for flow in self.declared for step in flow.steps if step.kind == "to" and step.topic]
        return found

    def stages(self) -> list[Stage]:
        """The stages this process runs: each flow's (its source and resume topics), each split's items and aggregate,
        each correlation aggregate, each barrier (aggregates and barriers ticked)."""
        found: list[Stage] = []
        for compiled in self.running():
            name = compiled.flow.name
            handler = per_event(agent=f"flow:{name}", what=f"flow {name!r}: message", handler=self._make_flow_handler(compiled))
            found.append(Stage(f"flow-{name}", (compiled.source, compiled.resume), handler, runs_user_steps=True))
        for segment in self.segments.values():
            found.append(Stage(segment.worker.agent.replace(":", "-"), (segment.items,), _items_handler(segment.worker)))
            found.append(_aggregate_stage(segment.results, segment.aggregation))
        for aggregate in self.correlating.values():
            found.append(_aggregate_stage(aggregate.results, aggregate.aggregation))
        found += self.windows.stages()
        found += [barrier.stage for barrier in self.barriers.values() if barrier.stage is not None]
        return found

    async def _run_step(self, step: Step, exchange: Exchange) -> StepOutcome:
        """A process or filter step on the exchange, under the retry policy; a value a process step returns becomes the payload."""
        function = step.function
        assert function is not None
        outcome = await run_with_retry(self.retry_policy, lambda: function(exchange))
        if outcome.ok and step.kind == "process" and outcome.value is not None:
            exchange.payload = outcome.value
        return outcome

    def _segment_steps(self, compiled: CompiledFlow, segment: Segment) -> Any:
        """The item step of a segment: its process steps, in order, on the item as an exchange of its own."""
        steps = [compiled.flow.steps[index] for index in segment.item_steps]

        async def run(payload: Any, index: int, message: dict[str, Any]) -> StepOutcome:
            total = message.get("total")
            exchange = Exchange(
                payload=payload,
                headers=dict(message.get("headers") or {}),
                properties={"split_index": index, "split_total": total},
                key=str(message.get("correlation_id")),
            )
            attempts = 0
            for step in steps:
                outcome = await self._run_step(step, exchange)
                attempts += outcome.attempts
                if not outcome.ok:
                    return StepOutcome(ok=False, value=None, error=f"step {step.name!r}: {outcome.error}", attempts=attempts)
            return StepOutcome(ok=True, value=exchange.payload, error=None, attempts=max(attempts, 1))

        return run

    def _aggregation(self, compiled: CompiledFlow, step: Step, results: faust.TopicT) -> Aggregation:
        """The aggregate stage of ``step`` (a split's or a correlation aggregate): its tables, and the resume of the flow."""
        assert step.aggregate is not None
        flow_name, name = compiled.flow.name, step.name
        agent = f"flow:{flow_name}:{name}"
        return Aggregation(
            agent=agent,
            config=step.aggregate.config(done_retention_ms=self.settings.done_retention_ms),
            open_groups=self.declare_table(
                f"flow-{flow_name}-{name}",
                f"Open groups of aggregate {name!r} of flow {flow_name!r} by correlation id: the items' outcomes (or the "
                "exchanges' payloads) so far, the deadline, the exchange to resume (value: tables.aggregates.GroupState).",
            ),
            done_groups=self.declare_table(
                f"flow-{flow_name}-{name}-done",
                f"Completed groups of aggregate {name!r}, kept to count late items (value: tables.aggregates.DoneState).",
            ),
            deadlines=self.declare_table(
                f"flow-{flow_name}-{name}-deadlines", f"Deadline index of aggregate {name!r} (app.deadlines.DeadlineIndex)."
            ),
            outputs=self._resume_after_aggregate(compiled, agent, fail_parent=step.aggregate.on_item_failure == FAIL_PARENT),
            current=self.declare_table(
                f"flow-{flow_name}-{name}-current",
                f"The open group of each partition of aggregate {name!r} (complete_on_new_group): partition -> correlation key.",
            )
            if step.aggregate.complete_on_new_group
            else None,
        )

    def _resume_after_aggregate(self, compiled: CompiledFlow, agent: str, *, fail_parent: bool = False) -> Any:
        def outputs(event: EventT[bytes], correlation_id: str, result: dict[str, Any], context: Any) -> list[Output]:
            if not isinstance(context, dict) or not isinstance(context.get("exchange"), dict):
                error = f"{agent}: group {correlation_id!r} completed without the exchange of its split (its open was lost)"
                record = dead_letter_record(
                    reason="error",
                    error=error,
                    agent=agent,
                    step="aggregate",
                    attempts=1,
                    topic=event.message.topic,
                    partition=event.message.partition,
                    offset=event.message.offset,
                    key=correlation_id.encode(),
                    value=dumps(result),
                )
                return [Output(self.dead_letters, correlation_id, record, what="a dead letter")]
            exchange = Exchange.from_dict(context["exchange"])
            meta = dict(context.get("meta") or {})
            if fail_parent and result.get("status") == FAILED_STATUS:
                # the parent fails as one (Camel's shareUnitOfWork): a dead letter holding the whole exchange, and a
                # failed outcome, as when one of its own steps fails
                error = str(result.get("error") or "an item failed")
                record = dead_letter_record(
                    reason=ITEM_FAILED,
                    error=error,
                    agent=f"flow:{compiled.flow.name}",
                    step=str(result.get("aggregator")),
                    attempts=1,
                    topic=event.message.topic,
                    partition=event.message.partition,
                    offset=event.message.offset,
                    key=exchange.key.encode() if exchange.key is not None else None,
                    value=dumps(exchange.to_dict()),
                )
                # the failed and missing indexes as an outline (a sample, the count, a sha256): a group of tens of
                # thousands of items still fits its dead letter
                failed, failed_count, failed_sha256 = outline_of(result.get("failed"))
                missing, missing_count, missing_sha256 = outline_of(result.get("missing"))
                record["result"] = {
                    "correlation_id": result.get("correlation_id"),
                    "failed_item": result.get("failed_item"),
                    "failed": failed,
                    "failed_count": failed_count,
                    "failed_sha256": failed_sha256,
                    "missing": missing,
                    "missing_count": missing_count,
                    "missing_sha256": missing_sha256,
                }
                letter = Output(self.dead_letters, correlation_id, fitted_dead_letter(record, record_limit()), what="a dead letter")
                return [letter, *self.outcome_outputs(compiled, meta, FAILED, error)]
            exchange.payload = result
            if "sequence" in result:  # a correlation group's result starts an execution of its own, keyed by the group's key
                exchange.key = correlation_id
                exchange_id = f"{compiled.flow.name}:{result.get('aggregator')}:{correlation_id}#{result['sequence']}"
                meta.update(self._execution_meta(compiled, exchange, exchange_id))
            resume = {"exchange": exchange.to_dict(), "meta": meta, "resume_step": context.get("resume_step")}
            key = exchange.key if exchange.key is not None else correlation_id
            return [Output(compiled.resume, key, resume, what="the resume after the aggregate")]

        return outputs

    def _execution_meta(self, compiled: CompiledFlow, exchange: Exchange, exchange_id: str) -> dict[str, Any]:
        """A new execution's meta: its id, and the key and part each barrier awaiting its flow reads, read on entry,
        before any step (a source record's exchange, or a group's or a window's result)."""
        return {
            "exchange_id": exchange_id,
            "keys": {awaited.barrier.name: awaited.key_of(exchange) for awaited in compiled.awaited_by},
            "parts": self._parts(compiled, exchange, exchange_id),
        }

    def _parts(self, compiled: CompiledFlow, exchange: Exchange, exchange_id: str) -> dict[str, str | None]:
        """Which execution this is, for each barrier that counts this flow's executions (read on entry, like the keys)."""
        return {
            awaited.barrier.name: awaited.part_of(exchange, exchange_id)
            for awaited in compiled.awaited_by
            if awaited.awaited.count is not None
        }

    def outcome_outputs(
        self, compiled: CompiledFlow, meta: dict[str, Any], outcome: str, error: str | None, result: Any = None
    ) -> list[Output]:
        """An execution ended: a completion to every barrier awaiting this flow (by the key read on entry), and its outcome.

        ``result``: the payload it ended with, sent to the barriers whose await asks for results."""
        keys: dict[str, str | None] = meta.get("keys", {})
        parts: dict[str, str | None] = meta.get("parts", {})
        outputs: list[Output] = []
        for awaited in compiled.awaited_by:
            key = keys.get(awaited.barrier.name)
            if key is None:
                continue  # the key could not be read on entry: this execution counts for no waiting exchange
            completion = {"kind": "completion", "flow": compiled.flow.name, "outcome": outcome, "error": error}
            if awaited.awaited.count is not None:
                part = parts.get(awaited.barrier.name)
                if part is None:
                    continue  # which execution this is could not be read on entry: it counts for none
                completion["part"] = part
            if awaited.awaited.results and outcome == COMPLETED:
                completion["result"] = result
            outputs.append(
                Output(
                    self.barrier_topics[awaited.barrier.name], key, completion, what=f"a completion for barrier {awaited.barrier.name!r}"
                )
            )
        record = {
            "flow": compiled.flow.name,
            "exchange_id": meta["exchange_id"],
            "outcome": outcome,
            "error": error,
            "keys": keys,
            "at_ms": now_ms(),
        }
        outputs.append(Output(compiled.outcomes, str(meta["exchange_id"]), record, what="the outcome"))
        return outputs

    async def publish_outcome(
        self, compiled: CompiledFlow, meta: dict[str, Any], outcome: str, error: str | None, event: EventT[bytes], result: Any = None
    ) -> None:
        """Send :func:`outcome_outputs`, checked (one that cannot be written is dead-lettered, never a crash)."""
        outputs = self.outcome_outputs(compiled, meta, outcome, error, result)
        await send_checked(event, outputs, agent=f"flow:{compiled.flow.name}", step="outcome")

    async def _fail(
        self,
        compiled: CompiledFlow,
        exchange: Exchange,
        meta: dict[str, Any],
        step: Step,
        reason: str,
        error: str,
        attempts: int,
        event: EventT[bytes],
    ) -> None:
        """The flow's error handling: a dead letter carrying the exchange, and a failed outcome."""
        record = dead_letter_record(
            reason=reason,
            error=error,
            agent=f"flow:{compiled.flow.name}",
            step=step.name,
            attempts=attempts,
            topic=event.message.topic,
            partition=event.message.partition,
            offset=event.message.offset,
            key=exchange.key.encode() if exchange.key is not None else None,
            value=dumps(exchange.to_dict()),
        )
        await send_dead_letter_record(record)
        await self.publish_outcome(compiled, meta, FAILED, error, event)

    def _waiting_keys(self, barrier: Barrier, exchange: Exchange) -> tuple[str | None, dict[str, str], str | None]:
        """Where a waiting exchange waits (read when it reaches the barrier), the awaited flows it awaits under keys of
        their own (flow name -> key), or why a key cannot be read.

        It waits under the barrier's ``correlate_by`` key, or the first await's key without one. An await whose own
        key differs (seed 004: each awaited flow correlates by its own expression) is relayed: a relay at that key
        forwards the flow's completion to the waiter (``tables.barrier.on_relay``).
        """
        values = {awaited.source: barrier.key_for(awaited)(exchange) for awaited in barrier.awaits}
        unreadable = sorted(source for source, value in values.items() if value is None)
        waiting_by = barrier.correlate_by(exchange) if barrier.correlate_by is not None else values[barrier.awaits[0].source]
        if unreadable:
            return None, {}, f"barrier {barrier.name!r}: the key for await(s) {unreadable} cannot be read from the exchange"
        if waiting_by is None:
            return None, {}, f"barrier {barrier.name!r}: its correlation key cannot be read from the exchange"
        relayed = {self.by_source[source].name: value for source, value in values.items() if value is not None and value != waiting_by}
        return waiting_by, relayed, None

    def _records(self, step: Step, exchange: Exchange) -> tuple[list[Output], str | None]:
        """The records of a ``to`` step: its payloads (``each``, else the exchange's) and their keys, or why not."""
        assert step.topic is not None
        headers = tuple((name, value.encode()) for name, value in exchange.headers.items())
        if step.each is None:
            payloads = [exchange.payload]
        else:
            try:
                payloads = step.each(exchange)
            except Exception as raised:  # reading the records is not retried: the same exchange gives the same answer
                return [], f"each: {describe_error(raised)}"
            if not isinstance(payloads, list):
                return [], f"each must give a list of payloads, got {type(payloads).__name__}"
        records = []
        for payload in payloads:
            if step.key is None:
                key = exchange.key
            else:
                key = step.key(Exchange(payload=payload, headers=exchange.headers, properties=exchange.properties, key=exchange.key))
                if key is None:
                    return [], f"the record key ({step.key.description}) cannot be read from {str(payload)[:80]!r}"
            records.append(Output(self._topic(step.topic), key, payload, headers=headers, what=f"step {step.name!r}"))
        return records, None

    def _expected_counts(self, barrier: Barrier, exchange: Exchange) -> tuple[dict[str, int], str | None]:
        """How many executions of each counted await this exchange awaits (flow name -> count), or why it cannot be read."""
        expected: dict[str, int] = {}
        for awaited in barrier.awaits:
            if awaited.count is None:
                continue
            if isinstance(awaited.count, int):
                count: Any = awaited.count
            else:
                reader = awaited.count.read if isinstance(awaited.count, KeyExpr) else awaited.count
                try:
                    count = reader(exchange)
                except Exception as raised:
                    return {}, f"barrier {barrier.name!r}: the count of {awaited.source!r} cannot be read: {describe_error(raised)}"
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                return {}, f"barrier {barrier.name!r}: the count of {awaited.source!r} must be a non-negative int, got {count!r:.60}"
            expected[self.by_source[awaited.source].name] = count
        return expected, None

    async def run_steps(self, compiled: CompiledFlow, exchange: Exchange, meta: dict[str, Any], start: int, event: EventT[bytes]) -> None:
        """Run the flow's steps from ``start`` until the end, a drop, a failure, or a barrier."""
        steps = compiled.flow.steps
        for index in range(start, len(steps)):
            step = steps[index]
            if step.kind in ("process", "filter"):
                outcome = await self._run_step(step, exchange)
                if not outcome.ok:
                    error = f"flow {compiled.flow.name!r}, step {step.name!r} failed after {outcome.attempts} attempts: {outcome.error}"
                    await self._fail(compiled, exchange, meta, step, "failed", error, outcome.attempts, event)
                    return
                if step.kind == "filter" and not outcome.value:
                    await self.publish_outcome(compiled, meta, COMPLETED, None, event, exchange.payload)  # dropped by a filter: completed
                    return
            elif step.kind == "to":
                records, problem = self._records(step, exchange)
                if problem is not None:
                    await self._fail(
                        compiled, exchange, meta, step, "invalid", f"flow {compiled.flow.name!r}, step {step.name!r}: {problem}", 1, event
                    )
                    return
                failed = await send_checked(event, records, agent=f"flow:{compiled.flow.name}", step=step.name)
                if failed:
                    await self.publish_outcome(compiled, meta, FAILED, f"step {step.name!r}: {failed[0].problem}", event)
                    return
            elif step.kind == "split":
                await self._split(compiled, step, index, exchange, meta, event)
                return  # the execution goes on after the aggregate, on this flow's resume topic
            elif step.kind == "aggregate":
                await self._to_correlation_group(compiled, step, index, exchange, meta, event)
                return  # this execution ends here; the group's result starts one of its own
            elif step.kind == "window":
                await self._to_window(compiled, step, exchange, meta, event)
                return  # this execution ends here; each window's result starts one of its own
            elif step.kind == "barrier":
                barrier = step.barrier
                assert barrier is not None
                key, relayed, problem = self._waiting_keys(barrier, exchange)
                expected, count_problem = self._expected_counts(barrier, exchange)
                if key is None or count_problem is not None:
                    await self._fail(compiled, exchange, meta, step, "invalid", str(problem or count_problem), 1, event)
                    return
                deadline_ms = now_ms() + barrier.timeout_ms
                arrival = {
                    "kind": "arrival",
                    "exchange_id": meta["exchange_id"],
                    "flow": compiled.flow.name,
                    "exchange": exchange.to_dict(),
                    "meta": meta,
                    "resume_step": index + 1,
                    "deadline_ms": deadline_ms,
                    **({"relayed": relayed} if relayed else {}),
                    **({"expected": expected} if expected else {}),
                }
                topic = self.barrier_topics[barrier.name]
                records = [Output(topic, key, arrival, what=f"the arrival at barrier {barrier.name!r}")]
                for flow, own_key in relayed.items():  # in the arrival's transaction: before any forward reaches it
                    relay = {"kind": "relay", "exchange_id": meta["exchange_id"], "flow": flow, "to": key, "deadline_ms": deadline_ms}
                    records.append(Output(topic, own_key, relay, what=f"a relay to barrier {barrier.name!r}"))
                # An arrival that cannot be written (an exchange larger than a record may hold) is this execution's
                # failure: dead-lettered whole, and its outcome says so; the barrier never hears of it.
                failed = await send_checked(event, records, agent=f"flow:{compiled.flow.name}", step=step.name, all_or_none=True)
                if failed:
                    await self.publish_outcome(compiled, meta, FAILED, f"barrier {step.name!r}: {failed[0].problem}", event)
                return  # the execution goes on when the barrier releases it, on this flow's resume topic
        await self.publish_outcome(compiled, meta, COMPLETED, None, event, exchange.payload)

    async def _split(
        self, compiled: CompiledFlow, step: Step, index: int, exchange: Exchange, meta: dict[str, Any], event: EventT[bytes]
    ) -> None:
        """Send the group's open (with the exchange, to resume it after the aggregate) and its items in chunks."""
        split = step.split
        assert split is not None
        segment = self.segments[(compiled.flow.name, index)]
        try:
            items = split.items(exchange)  # reading the items is not retried: the same exchange gives the same answer
            problem = None if isinstance(items, list) and items else f"the items must be a non-empty list, got {type(items).__name__}"
        except Exception as raised:
            problem = describe_error(raised)
        if problem is not None:
            await self._fail(
                compiled, exchange, meta, step, "invalid", f"flow {compiled.flow.name!r}, split {step.name!r}: {problem}", 1, event
            )
            return
        correlate_by = split.correlate_by
        correlation_id = correlate_by(exchange) if correlate_by is not None else str(meta["exchange_id"])
        if correlation_id is None:
            described = correlate_by.description if correlate_by is not None else "the execution id"
            unreadable = f"flow {compiled.flow.name!r}, split {step.name!r}: the correlation id ({described}) cannot be read"
            await self._fail(compiled, exchange, meta, step, "invalid", unreadable, 1, event)
            return
        aggregate = compiled.flow.steps[segment.segment.aggregate_index].aggregate
        assert aggregate is not None
        context = {"exchange": exchange.to_dict(), "meta": meta, "resume_step": segment.segment.aggregate_index + 1}
        opened, chunks = split_messages(
            correlation_id,
            items,
            chunk=split.chunk or self.settings.split_chunk,
            deadline_ms=None if aggregate.timeout_ms is None else now_ms() + aggregate.timeout_ms,
            context=context,
            headers=exchange.headers,
            origin=str(meta["exchange_id"]),
        )
        await send_split(correlation_id, opened, chunks, results=segment.results, items=segment.items)

    async def _to_correlation_group(
        self, compiled: CompiledFlow, step: Step, index: int, exchange: Exchange, meta: dict[str, Any], event: EventT[bytes]
    ) -> None:
        """Send the exchange as a part of its key's group (a correlation aggregate), and end its execution, completed.

        The part and the outcome go in the transaction that commits the exchange's offset: the part is merged
        once (the aggregate knows a redelivery by its read position), and the execution is accounted for.
        """
        aggregate = step.aggregate
        assert aggregate is not None
        assert aggregate.correlate_by is not None
        key = aggregate.correlate_by(exchange)
        if key is None:
            unreadable = (
                f"flow {compiled.flow.name!r}, aggregate {step.name!r}: the key ({aggregate.correlate_by.description}) cannot be read"
            )
            await self._fail(compiled, exchange, meta, step, "invalid", unreadable, 1, event)
            return
        try:
            flag = bool(aggregate.complete_on(exchange)) if aggregate.complete_on is not None else False
        except Exception as raised:
            problem = f"flow {compiled.flow.name!r}, aggregate {step.name!r}: complete_on failed: {describe_error(raised)}"
            await self._fail(compiled, exchange, meta, step, "invalid", problem, 1, event)
            return
        timeout_ms = None
        if aggregate.timeout_from is not None:
            try:
                read = aggregate.timeout_from(exchange)
                timeout_ms = None if read is None else int(read)
                if timeout_ms is not None and timeout_ms <= 0:
                    raise ValueError(f"a timeout must be positive, got {timeout_ms}")
            except Exception as raised:
                problem = f"flow {compiled.flow.name!r}, aggregate {step.name!r}: timeout_from failed: {describe_error(raised)}"
                await self._fail(compiled, exchange, meta, step, "invalid", problem, 1, event)
                return
        target = self.correlating[(compiled.flow.name, index)]
        # The group's result replaces the payload on resume: the context keeps the rest of the exchange only.
        context = {"exchange": {**exchange.to_dict(), "payload": None}, "meta": {}, "resume_step": index + 1}
        part = {
            "kind": "part",
            "correlation_id": key,
            "payload": exchange.payload,
            "flag": flag,
            "context": context,
            "timeout_ms": timeout_ms,
        }
        outputs = [Output(target.results, key, part, what=f"a part for aggregate {step.name!r}")]
        failed = await send_checked(event, outputs, agent=f"flow:{compiled.flow.name}", step=step.name)
        if failed:
            await self.publish_outcome(compiled, meta, FAILED, f"aggregate {step.name!r}: {failed[0].problem}", event)
            return
        await self.publish_outcome(compiled, meta, COMPLETED, None, event, exchange.payload)

    async def _to_window(self, compiled: CompiledFlow, step: Step, exchange: Exchange, meta: dict[str, Any], event: EventT[bytes]) -> None:
        """Send the exchange's payload, with its key and event time, to the window step's records topic, and end its
        execution, completed (both in the transaction that commits the exchange's offset)."""
        window = step.window
        assert window is not None
        where = f"flow {compiled.flow.name!r}, window {step.name!r}"
        try:
            key = window.key(exchange) if window.key is not None else exchange.key
            stamp = window.timestamp(exchange) if window.timestamp is not None else None
        except Exception as raised:
            await self._fail(compiled, exchange, meta, step, "invalid", f"{where}: {describe_error(raised)}", 1, event)
            return
        if stamp is None:
            stamp = meta.get("ts")
        if key is None or not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
            problem = f"{where}: the key ({key!r:.60}) and a non-negative integer event time in ms ({stamp!r:.60}) are needed"
            await self._fail(compiled, exchange, meta, step, "invalid", problem, 1, event)
            return
        record = {"payload": exchange.payload, "ts": stamp}
        outputs = [
            Output(self.windowed[_window_name(compiled.flow.name, step.name)].records, str(key), record, what=f"a record for {where}")
        ]
        failed = await send_checked(event, outputs, agent=f"flow:{compiled.flow.name}", step=step.name)
        if failed:
            await self.publish_outcome(compiled, meta, FAILED, f"window {step.name!r}: {failed[0].problem}", event)
            return
        await self.publish_outcome(compiled, meta, COMPLETED, None, event, exchange.payload)

    def _make_flow_handler(self, compiled: CompiledFlow) -> Any:
        resume_name = compiled.resume.get_topic_name()

        async def handle(event: EventT[bytes], body: Any) -> None:
            if event.message.topic == resume_name:
                if not isinstance(body, dict) or not isinstance(body.get("exchange"), dict) or not isinstance(body.get("resume_step"), int):
                    raise InvalidMessage(f"flow {compiled.flow.name!r}: a resume message needs 'exchange', 'meta' and 'resume_step'")
                await self.run_steps(
                    compiled, Exchange.from_dict(body["exchange"]), dict(body.get("meta") or {}), body["resume_step"], event
                )
                return
            exchange = _exchange_from_event(event, body)
            message = event.message
            identity = compiled.flow.id_by(exchange) if compiled.flow.id_by is not None else None
            exchange_id = (
                f"{compiled.flow.name}:{identity}"
                if identity is not None
                else f"{compiled.flow.name}@{message.topic}:{message.partition}:{message.offset}"
            )
            meta = self._execution_meta(compiled, exchange, exchange_id)
            # the event time of the execution (a window step's default): the timestamp of the record that started it
            meta["ts"] = round(message.timestamp * 1000) if message.timestamp is not None and message.timestamp >= 0 else None
            await self.run_steps(compiled, exchange, meta, 0, event)

        return handle

    def _barrier_change(
        self,
        compiled: CompiledBarrier,
        key: str,
        transition: BarrierTransition,
        previous: BarrierState | None,
        event: EventT[bytes],
        *,
        tick: bool,
    ) -> Change[BarrierState]:
        """The core's transition as the runtime's change: releases resume the owner flow; failures are dead-lettered and
        end their execution as failed; the key's next due instant is filed when it moved (on a tick, always)."""
        owner = self.flows[compiled.owner]
        outputs: list[Output] = []
        for release in transition.releases:
            waiting = release.waiting
            # how the wait ended, and what the awaited executions gave, when the barrier says so
            exchange = reported(release, compiled.barrier.name) if compiled.barrier.reports else waiting.exchange
            resume = {"exchange": exchange, "meta": waiting.meta, "resume_step": waiting.resume_step}
            outputs.append(Output(owner.resume, key, resume, what="the resume after the barrier"))
        for failure in transition.failures:
            outputs += self._give_up(compiled, owner, key, failure, event)
        for forward in transition.forwards:
            message: dict[str, Any] = {"kind": "forwarded", "exchange_id": forward.exchange_id, "flow": forward.flow}
            message.update(outcome=forward.outcome, error=forward.error)
            if forward.result is not None:
                message["result"] = forward.result
            outputs.append(Output(compiled.topic, forward.to, message, what=f"a forwarded completion of {forward.flow!r}"))
        metrics.barrier_settled(compiled.barrier.name, released=len(transition.releases), failed=[f.reason for f in transition.failures])
        state = transition.state
        due = state.next_due_ms() if state is not None else None
        moved = due is not None and (tick or previous is None or previous.next_due_ms() != due)
        return Change(state=state, outputs=tuple(outputs), deadlines=(due,) if moved and due is not None else ())

    def _give_up(self, compiled: CompiledBarrier, owner: CompiledFlow, key: str, failure: Failure, event: EventT[bytes]) -> list[Output]:
        """A waiting exchange failed at the barrier: its own flow's error handling (dead letter, failed outcome)."""
        waiting = failure.waiting
        record = dead_letter_record(
            reason=failure.reason,
            error=failure.error,
            agent=f"flow:{owner.flow.name}",
            step=compiled.barrier.name,
            attempts=1,
            topic=event.message.topic,
            partition=event.message.partition,
            offset=event.message.offset,
            key=key.encode(),
            value=dumps(waiting.exchange),
        )
        record["awaiting"] = [{"flow": flow, "key": waiting.key_of(flow, key)} for flow in failure.missing]
        letter = Output(self.dead_letters, key, fitted_dead_letter(record, record_limit()), what="a dead letter")
        return [letter, *self.outcome_outputs(owner, waiting.meta, FAILED, failure.error)]

    def _barrier_logic(self, compiled: CompiledBarrier) -> KeyedLogic[BarrierState]:
        """A barrier as a keyed logic: per correlation key (the record's key), an arrival, a completion, a relay or a
        forwarded completion changes the key's state (:mod:`tables.barrier`); its deadlines time the waiters out."""
        name = compiled.barrier.name
        rules = compiled.barrier

        def key_of(message: Any, record_key: str) -> str:
            if not record_key:
                kind = message.get("kind") if isinstance(message, dict) else None
                raise InvalidMessage(f"barrier {name!r}: a {kind!r} message needs the correlation key as its Kafka key")
            return record_key

        def change(key: str, transition: BarrierTransition, previous: BarrierState | None, *, tick: bool = False) -> Change[BarrierState]:
            return self._barrier_change(compiled, key, transition, previous, handled_event(), tick=tick)

        def arrival(previous: BarrierState | None, key: str, message: dict[str, Any], now: int) -> Change[BarrierState]:
            waiting = Waiting(
                exchange_id=str(message["exchange_id"]),
                flow=str(message["flow"]),
                arrived_ms=now,
                deadline_ms=int(message["deadline_ms"]),
                awaited=tuple(self.by_source[awaited.source].name for awaited in rules.awaits),
                exchange=dict(message["exchange"]),
                resume_step=int(message["resume_step"]),
                meta=dict(message.get("meta") or {}),
                relayed={str(flow): str(own) for flow, own in (message.get("relayed") or {}).items()},
                expected={str(flow): int(count) for flow, count in (message.get("expected") or {}).items()},
            )
            transition = on_arrival(
                previous, key, waiting, name, now, on_duplicate=rules.on_duplicate, on_failure=rules.on_failure, memory=rules.memory
            )
            return change(key, transition, previous)

        def completion(previous: BarrierState | None, key: str, message: dict[str, Any], now: int) -> Change[BarrierState]:
            flow = str(message["flow"])
            remember = compiled.remember_ms.get(flow)
            if remember is None:
                raise InvalidMessage(f"barrier {name!r}: a completion of flow {flow!r}, which it does not await")
            part = message.get("part")
            transition = on_completion(
                previous,
                key,
                flow,
                str(message["outcome"]),
                message.get("error"),
                remember,
                name,
                now,
                result=message.get("result"),
                part=None if part is None else str(part),
                on_failure=rules.on_failure,
                memory=rules.memory,
            )
            return change(key, transition, previous)

        def relay(previous: BarrierState | None, key: str, message: dict[str, Any], now: int) -> Change[BarrierState]:
            relayed = Relay(str(message["exchange_id"]), str(message["flow"]), str(message["to"]), int(message["deadline_ms"]))
            return change(key, on_relay(previous, key, relayed, now), previous)

        def forwarded(previous: BarrierState | None, key: str, message: dict[str, Any], now: int) -> Change[BarrierState]:
            transition = on_forwarded(
                previous,
                key,
                str(message["exchange_id"]),
                str(message["flow"]),
                str(message["outcome"]),
                message.get("error"),
                name,
                result=message.get("result"),
                on_failure=rules.on_failure,
            )
            return change(key, transition, previous)

        def on_deadline(key: str, state: BarrierState, now: int) -> Change[BarrierState]:
            return change(key, on_tick(state, name, now, on_timeout=rules.on_timeout), state, tick=True)

        return KeyedLogic(
            name=f"barrier:{name}",
            key_of=key_of,
            on_message={"arrival": arrival, "completion": completion, "relay": relay, "forwarded": forwarded},
            encode=BarrierState.to_dict,
            decode=BarrierState.from_dict,
            due_ms=lambda _kind, state: state.next_due_ms(),
            on_deadline=on_deadline,
            step=name,
            label=f"barrier {name!r}",
        )


def _items_handler(worker: ItemWorker) -> Any:
    async def handle_part(part: Sequence[EventT[bytes]]) -> None:
        await worker.handle_part(part, what=f"{worker.agent}: item")

    return handle_part


def _aggregate_stage(topic: Any, aggregation: Aggregation) -> Stage:
    """The stage of an aggregate (a split's, or one by key) on its results topic, ticked for its deadlines; with
    ``complete_at_batch_end``, each part's groups completed when the part is handled."""
    handler = per_event(agent=aggregation.agent, what=f"{aggregation.agent}: message", handler=aggregation.handle)
    if aggregation.config.complete_at_batch_end:
        each = handler

        async def handler(part: Sequence[EventT[bytes]]) -> None:
            await each(part)
            await dead_lettered(part[-1], agent=aggregation.agent, run=functools.partial(aggregation.complete_batch, part[-1]))

    return Stage(aggregation.agent.replace(":", "-"), (topic,), handler, ticked=(topic,))
