"""What the end-of-stream agents share: their topics, the protocol's settings, ticks and sends."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import faust
from faust.types import EventT, TableT

from app.catalogue import CATALOGUE_CENTS
from app.codec import dumps
from app.core import app, send_dead_letter, settings, topics
from app.deadlines import DeadlineIndex
from tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_REPORTS, Emit, EofConfig, OpeningHours

__all__ = ["batches_topic", "counter_topic", "aggregate_topic", "reports_topic", "CONFIG", "HOURS", "CATALOGUE", "emit", "ClientStates"]


def _topic(name: str) -> faust.TopicT:
    return app.topic(settings.topic(name), partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


batches_topic = _topic(TOPIC_BATCHES)
counter_topic = _topic(TOPIC_COUNTER)
aggregate_topic = _topic(TOPIC_AGGREGATE)
reports_topic = _topic(TOPIC_REPORTS)
topics.extra.extend([batches_topic, counter_topic, aggregate_topic, reports_topic])

CONFIG = EofConfig(idle_timeout_ms=settings.eof_idle_timeout_ms, closed_retention_ms=settings.eof_closed_retention_ms)
HOURS = OpeningHours()
#: The flavour catalogue (price per scoop in cents) the filter checks and the report joins with.
CATALOGUE = CATALOGUE_CENTS


async def emit(client: str, emits: list[Emit]) -> None:
    """Send the core's messages, keyed by the client; awaited, so they join the event's transaction."""
    targets = {"aggregate": aggregate_topic, "reports": reports_topic}
    sent = [await targets[message.to].send(key=client.encode(), value=dumps(message.value)) for message in emits]
    for future in sent:
        await future


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
    """One client per key of ``table``: load it, apply a core's transition, expire it on ticks.

    One deadline entry per client at a time (filed when the client appears or closes); a tick re-files
    it when activity moved the deadline.
    """

    def __init__(
        self, table: TableT[str, Any], deadlines: TableT[str, Any], decode: Callable[[Mapping[str, Any]], S], *, agent: str, step: str
    ) -> None:
        self.table = table
        self.deadlines = DeadlineIndex(deadlines)
        self.decode = decode
        self.agent = agent
        self.step = step

    def load(self, client: str) -> S | None:
        raw = self.table.get(client)
        return None if raw is None else self.decode(raw)

    async def apply(self, event: EventT[bytes], client: str, previous: S | None, transition: _Transition[S]) -> None:
        if transition.rejected is not None:
            await send_dead_letter(event, reason="rejected", error=transition.rejected, agent=self.agent, step=self.step)
        state = transition.state
        if state is None:
            if previous is not None:
                del self.table[client]
        elif state != previous:
            self.table[client] = state.to_dict()
            if previous is None or previous.closed_ms != state.closed_ms:
                self.deadlines.add(event.message.partition, "client", client, state.deadline_ms(CONFIG))
        await emit(client, transition.emits)

    async def tick(self, event: EventT[bytes], now_ms: int, on_tick: Callable[[S, EofConfig, int], _Transition[S]]) -> None:
        def deadline_of(client: str) -> int | None:
            state = self.load(client)
            return None if state is None else state.deadline_ms(CONFIG)

        async def expire(client: str) -> None:
            state = self.load(client)
            if state is not None:
                await self.apply(event, client, state, on_tick(state, CONFIG, now_ms))

        await self.deadlines.walk_keys(event.message.partition, now_ms, deadline_of, expire)
