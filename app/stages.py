"""A stage: one agent of a topology, as a value. A worker serves it as a Faust agent, the test driver in process.

A topology (the flows' :class:`app.flow_topology.FlowTopology`, say) is built from settings and two factories, one
for topics and one for tables, and lists its stages: what each reads, what it does with one source partition's
part of a batch, and which of its topics get a tick. :meth:`app.application.Application.serve` turns a stage into a Faust agent (and
its tick timer); :class:`app.testing.TestDriver` hands it the records of in-memory topics. The stage's code is the
same in both.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faust.types import EventT

from weir.app.settings import Settings
from weir.app.shell import EventHandler, OwedOutcome, handle_part_events

__all__ = ["Stage", "Timer", "Wiring", "PartHandler", "TopicFactory", "TableFactory", "per_event"]

#: What a stage does with one source partition's part of a batch (in offset order), inside its exactly-once scope.
PartHandler = Callable[[Sequence[EventT[bytes]]], Awaitable[None]]


#: A topic by its full name (the settings' prefix included).
TopicFactory = Callable[[str], Any]
#: A table of string keys and JSON values, by name and help text (partitioned like the topics).
TableFactory = Callable[[str, str], Any]


@dataclass(frozen=True)
class Wiring:
    """How a topology declares what it uses: the settings, topics and tables by name, and where dead letters go.

    A worker's wiring declares Faust topics and tables (:attr:`app.application.Application.wiring`); the test driver's, in-memory
    ones. ``topic`` takes the full name (:meth:`topic_named` adds the settings' prefix).
    """

    settings: Settings
    topic: TopicFactory
    table: TableFactory
    dead_letters: Any

    def topic_named(self, name: str) -> Any:
        """The topic ``name`` with the settings' prefix (``WEIR_TOPIC_PREFIX``) in front."""
        return self.topic(self.settings.topic(name))


@dataclass(frozen=True)
class Timer:
    """Work a stage's worker does every ``every_s`` seconds outside any event (it may not write a table: I/O, a log line)."""

    every_s: float
    run: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Stage:
    """One agent: its name, the topics it reads, its part handler, and the topics whose partitions it ticks."""

    name: str
    sources: tuple[Any, ...]
    handle_part: PartHandler
    #: it runs the user's steps, whose time can jump: a slice begins no event once its budget is spent (:func:`app.core.run_sliced`)
    runs_user_steps: bool = False
    #: topics (of ``sources``) whose owned partitions get ``tick_value`` every ``tick_every_ms`` (default: the settings' tick interval)
    ticked: tuple[Any, ...] = ()
    tick_value: Any = field(default_factory=lambda: {"kind": "tick"})
    tick_every_ms: int | None = None
    #: events per batch and the longest wait for a batch to fill (default: the settings' ``WEIR_BATCH_SIZE``/``_WAIT_MS``)
    batch_size: int | None = None
    batch_wait_ms: int | None = None
    timers: tuple[Timer, ...] = ()
    #: a batch's partition parts run at once, each in its own scope (a step that waits on I/O: the items stage)
    concurrent_parts: bool = False


def per_event(*, agent: str, what: str, handler: EventHandler, owed: OwedOutcome | None = None) -> PartHandler:
    """A part handler that decodes each event and hands it to ``handler``, dead-lettering what fails (one by one)."""

    async def handle_part(part: Sequence[EventT[bytes]]) -> None:
        await handle_part_events(part, agent=agent, what=what, handler=handler, owed=owed)

    return handle_part
