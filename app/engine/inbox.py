"""Batches straight from the delivery loop: an agent's records go to its inbox, not through Faust's conductor,
channel and Stream (``EngineConfig.direct_batches``).

Faust hands every record to an agent through four layers: the conductor's callback (flow control, the
producer's ebb, a reference count, the channel's decode into an ``Event``, a queue put), the channel's
queue, the ``Stream``'s iterator (generation check, tracking, sensors, the current event, its processors),
and weir's ``take_ready`` processor, which awaits once per record to gather a batch. weir's agents take
batches anyway and make their own checks inside the commit gate (:func:`~app.engine.delivery.to_process`),
so here the delivery loop (:meth:`~app.engine.delivery.WeirConsumer._drain_messages`) appends each record of
an agent's topic to the agent's :class:`Inbox`, and the agent takes whatever is there as one batch. What is
left per record: one ``Message`` (the offset bookkeeping and acks are Faust's, on it) and one ``Event`` (the
record as every agent reads it: ``event.message``, ``event.ack()``, the current event of a part scope).

Everything else stays Faust's: the agent, the worker command, the subscription (the agent's topic is
subscribed as before: its channel is iterated once, here), tables and their changelogs, the web server.
An inbox serves a topic only when no other agent of the process reads it and its records are raw bytes
(every weir topic); otherwise that agent takes Faust's way (:func:`~app.engine.streams.take_ready`).

Delivery keeps the delivery loop's contract: a record is delivered once it is in the inbox (its offset is
the partition's next position); an inbox holding ``limit`` records makes the loop wait, raced against the
flow stopping, as a full channel queue did. Records of an older consumer generation, or taken while a
rebalance holds the gate, are left out by the agent's checks and come again from the committed offset;
those of revoked partitions are dropped from the inbox at the revocation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

from faust.types import TP, AppT, EventT, Message, StreamT

__all__ = ["Inbox", "open_inbox", "inbox_for", "drop_revoked", "inbox_batches"]


class Inbox:
    """One agent's records, appended by the delivery loop, taken by the agent in batches of up to ``max_``."""

    __slots__ = ("_event", "_ready", "_space", "app", "events", "limit", "topics")

    def __init__(self, app: AppT, topics: Iterable[str], limit: int) -> None:
        self.app = app
        self.topics = frozenset(topics)
        self.limit = max(1, limit)
        self.events: list[EventT[bytes]] = []
        self._ready = asyncio.Event()
        self._space = asyncio.Event()
        self._space.set()
        #: the app's event class (what ``app.create_event`` makes, without reading Faust's settings per record)
        self._event: Any = app.conf.Event

    def full(self) -> bool:
        return len(self.events) >= self.limit

    async def wait_space(self) -> None:
        """Until the agent has taken enough for the inbox to hold fewer than ``limit`` records."""
        await self._space.wait()

    def put(self, message: Message) -> None:
        """Deliver one record (its consumer message) to the agent."""
        self.events.append(self._event(self.app, message.key, message.value, message.headers, message))
        if len(self.events) >= self.limit:
            self._space.clear()
        self._ready.set()

    def drop(self, partitions: set[TP]) -> None:
        """Forget the records of ``partitions`` (revoked: their new owner reads them from the committed offset)."""
        if partitions and self.events:
            self.events = [event for event in self.events if event.message.tp not in partitions]
            self._settle()

    async def take(self, max_: int) -> list[EventT[bytes]]:
        """The next batch: up to ``max_`` records, in delivery order, as soon as there is one."""
        while not self.events:
            self._ready.clear()
            await self._ready.wait()
        if len(self.events) <= max_:
            batch, self.events = self.events, []
        else:
            batch, self.events = self.events[:max_], self.events[max_:]
        self._settle()
        inbound = self.app.monitor.stream_inbound_time  # Faust's "stream not processing" check reads it
        now = time.monotonic()
        for tp in {event.message.tp for event in batch}:
            inbound[tp] = now
        return batch

    def _settle(self) -> None:
        if len(self.events) < self.limit:
            self._space.set()
        if not self.events:
            self._ready.clear()


#: The inboxes of this process, by the topic they serve (read by the delivery loop for every record).
_inboxes: dict[str, Inbox] = {}


def inbox_for(topic: str) -> Inbox | None:
    return _inboxes.get(topic)


def drop_revoked(partitions: set[TP]) -> None:
    for inbox in set(_inboxes.values()):
        inbox.drop(partitions)


def _topic_names(channel: Any) -> tuple[str, ...] | None:
    """The topic names a channel reads, or None when it is not a plain topic of raw records (a pattern, a channel)."""
    names = getattr(channel, "topics", None)
    if not names or getattr(channel, "pattern", None) is not None:
        return None
    conf = channel.app.conf
    key_serializer = getattr(channel, "key_serializer", None) or conf.key_serializer
    value_serializer = getattr(channel, "value_serializer", None) or conf.value_serializer
    if key_serializer != "raw" or value_serializer != "raw":
        return None
    return tuple(names)


def open_inbox(stream: StreamT[bytes], limit: int) -> Inbox | None:
    """The inbox of the agent reading ``stream``; None when its topics cannot have one (see the module docstring).

    Iterates the stream's channel once, as Faust's stream does: that is what makes the worker subscribe to
    its topics (Faust's ``Topic.__aiter__`` adds it to the conductor). Its records never reach that channel.
    """
    faust_stream = cast(Any, stream)
    channel = faust_stream.channel
    names = _topic_names(channel)
    if names is None:
        return None
    readers: dict[str, int] = {}
    for agent in faust_stream.app.agents.values():
        for name in getattr(agent.channel, "topics", None) or ():
            readers[name] = readers.get(name, 0) + 1
    if any(readers.get(name, 0) > 1 for name in names):
        return None
    opened = {_inboxes.get(name) for name in names}
    if opened != {None}:
        # This agent's inbox, opened by its actor before Faust's supervisor restarted it (an actor that raised):
        # the records in it were delivered and not taken yet, and the delivery loop goes on filling it.
        inbox = opened.pop()
        if opened or inbox is None or inbox.topics != frozenset(names):
            return None
        return inbox
    inbox = Inbox(faust_stream.app, names, limit)
    for name in names:
        _inboxes[name] = inbox
    channel.__aiter__()  # subscribes the topics (the conductor's callbacks for them are never called)
    return inbox


async def inbox_batches(inbox: Inbox, max_: int) -> AsyncIterator[list[EventT[bytes]]]:
    """The agent's batches from its inbox, for as long as the agent runs.

    The inbox outlives the actor: an actor that raised is restarted by Faust's supervisor and takes the same
    inbox again (:func:`open_inbox`); records the delivery loop put there meanwhile are not lost to it.
    """
    while True:
        yield await inbox.take(max_)
