"""What the end-of-stream agents share: their topics, the protocol's settings, and the clients' keyed state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import faust
from faust.types import EventT, TableT

from app.core import app, settings, topics
from app.deadlines import DeadlineIndex
from app.runtime.keyed import Change, KeyedState, Output, TableStore
from app.settings import load_named
from tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_JOIN, TOPIC_REPORTS, Emit, EofConfig, EofJob

__all__ = [
    "batches_topic",
    "counter_topic",
    "aggregate_topic",
    "join_topic",
    "reports_topic",
    "CONFIG",
    "JOB",
    "load_job",
    "outputs",
    "ClientStates",
]


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(name), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


batches_topic = _topic(TOPIC_BATCHES)
counter_topic = _topic(TOPIC_COUNTER)
aggregate_topic = _topic(TOPIC_AGGREGATE)
join_topic = _topic(TOPIC_JOIN)
reports_topic = _topic(TOPIC_REPORTS)
topics.extra.extend([batches_topic, counter_topic, aggregate_topic, join_topic, reports_topic])

CONFIG = EofConfig(idle_timeout_ms=settings.eof_idle_timeout_ms, closed_retention_ms=settings.eof_closed_retention_ms)


def load_job(spec: str) -> EofJob:
    """Import the end-of-stream job named ``module:NAME`` (``WEIR_EOF_JOB``); weir has no default job."""
    if not spec:
        message = (
            "setting WEIR_EOF_JOB is not set: the eof_* agents run the end-of-stream job it names, "
            "'module:NAME' of a tables.eof.EofJob (weir has no default job)"
        )
        raise ValueError(message)
    job: EofJob = load_named("WEIR_EOF_JOB", spec, "a tables.eof.EofJob", lambda found: isinstance(found, EofJob))
    return job


#: The job the filter, aggregator and joiner run (every worker of one deployment names the same one).
JOB = load_job(settings.eof_job)
#: Where the cores' messages go: the pipeline's stages, and the job's own stages that keep per-client state.
_TARGETS: dict[str, faust.TopicT] = {
    "aggregate": aggregate_topic,
    "join": join_topic,
    "reports": reports_topic,
    **{name: _topic(name) for name in JOB.cleanup_topics},
}


def outputs(client: str, emits: list[Emit]) -> tuple[Output, ...]:
    """The core's messages as the runtime's outputs, keyed by the client (a job's cleanup: by its own key)."""
    return tuple(
        Output(_TARGETS[message.to], client if message.key is None else message.key, message.value, what=f"the {message.to} message")
        for message in emits
    )


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


class ClientStates(Generic[S]):
    """One client per key of ``table``, through the keyed-state runtime (:class:`app.runtime.keyed.KeyedState`).

    One deadline entry per client at a time (filed when the client appears or closes); a tick re-files
    it when activity moved the deadline.
    """

    def __init__(
        self, table: TableT[str, Any], deadlines: TableT[str, Any], decode: Callable[[Mapping[str, Any]], S], *, agent: str, step: str
    ) -> None:
        self.keyed: KeyedState[S] = KeyedState(
            agent=agent,
            store=TableStore(table, _encode, decode),
            deadlines=DeadlineIndex(deadlines),
            step=step,
            deadline_kind="client",
        )
        self.agent = agent
        self.step = step

    def load(self, client: str) -> S | None:
        return self.keyed.load(client)

    def change(self, client: str, previous: S | None, transition: _Transition[S]) -> Change[S]:
        """The core's transition as the runtime's change: the client's deadline is filed when it appears or closes."""
        state = transition.state
        deadlines: tuple[int, ...] = ()
        if state is not None and state != previous and (previous is None or previous.closed_ms != state.closed_ms):
            deadlines = (state.deadline_ms(CONFIG),)
        rejected = () if transition.rejected is None else (transition.rejected,)
        return Change(state=state, outputs=outputs(client, transition.emits), rejected=rejected, deadlines=deadlines)

    async def apply(self, event: EventT[bytes], client: str, previous: S | None, transition: _Transition[S]) -> None:
        await self.keyed.apply(event, client, previous, self.change(client, previous, transition))

    async def tick(self, event: EventT[bytes], now_ms: int, on_tick: Callable[[S, EofConfig, int], _Transition[S]]) -> None:
        await self.keyed.walk_deadlines(
            event,
            now_ms,
            lambda _kind, state: state.deadline_ms(CONFIG),
            lambda client, state, now: self.change(client, state, on_tick(state, CONFIG, now)),
        )


def _encode(state: _ClientState) -> Any:
    return state.to_dict()
