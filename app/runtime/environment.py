"""What a stage runs against: a clock, an outlet for its records, and the size limits. A worker's: the wall clock and the engine.

Every stage reads the time, sleeps (a retry's backoff, a refused send's) and sends records only through
:func:`current`. A worker installs its environment once (:func:`install`: the wall clock, the engine's transactional
producer, its dead-letter topic and limits, ``app.core``); the test driver (:mod:`app.testing`) runs stages in one of
its own (:func:`using`: a virtual clock, in-memory topics). Nothing else differs between the two, so a behaviour the
driver shows is the behaviour of the code a worker runs. Code that runs outside both (a unit test of one function)
gets :data:`STANDALONE`: the wall clock, and each topic's own ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Clock", "WallClock", "Outlet", "TopicOutlet", "Environment", "STANDALONE", "current", "using", "install", "send_record"]


class Clock(Protocol):
    """The time a stage reads, and how it waits."""

    def now_ms(self) -> int: ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The machine's clock; waits are real."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


Headers = list[tuple[str, bytes]] | None


class Outlet(Protocol):
    """Where a stage's records go: a worker's engine, or the test driver's topics."""

    #: the topic the dead letters go to
    @property
    def dead_letters(self) -> Any: ...

    async def send(self, topic: Any, key: bytes | None, value: bytes, headers: Headers, partition: int | None) -> None:
        """Send one record to ``topic`` (to ``partition``, else by its key), in the current transaction."""
        ...

    def partitions(self, topic: str) -> int | None:
        """How many partitions the topic named ``topic`` has (None: unknown)."""
        ...

    async def signal(self, topic: Any, value: bytes, partition: int) -> None:
        """A control record (a tick) to one partition, outside any transaction: visible at once, even to an idle partition."""
        ...


class TopicOutlet:
    """Each topic's own ``send`` (a Faust topic's, or a unit test's stand-in); the dead letters to ``dead_letters``;
    the topics' partition counts as ``partitions`` says (none: unknown)."""

    def __init__(self, dead_letters: Any = None, *, partitions: Mapping[str, int] | None = None) -> None:
        self.dead_letters = dead_letters
        self.counts = dict(partitions or {})

    async def send(self, topic: Any, key: bytes | None, value: bytes, headers: Headers, partition: int | None) -> None:
        extra: dict[str, Any] = {}  # only what was given: a stand-in may take no more
        if partition is not None:
            extra["partition"] = partition
        if headers:
            extra["headers"] = headers
        await topic.send(key=key, value=value, **extra)

    def partitions(self, topic: str) -> int | None:
        return self.counts.get(topic)

    async def signal(self, topic: Any, value: bytes, partition: int) -> None:
        await topic.send(key=None, value=value, partition=partition)


@dataclass(frozen=True)
class Environment:
    """A clock, an outlet, and the limits: the largest message a stage decodes, the largest value it sends."""

    clock: Clock
    outlet: Outlet
    max_message_bytes: int = 1_000_000
    record_limit: int = 1_000_000 - 1024


#: Outside a worker and a driver: the wall clock, each topic's own send, the default limits.
STANDALONE = Environment(clock=WallClock(), outlet=TopicOutlet())

_installed: list[Environment] = [STANDALONE]
_current: contextvars.ContextVar[Environment | None] = contextvars.ContextVar("weir_environment", default=None)


def current() -> Environment:
    """The environment of the code running now: the driver's inside :func:`using`, else the one installed."""
    return _current.get() or _installed[0]


def install(environment: Environment) -> None:
    """This process's environment from now on (a worker's, once, as it starts)."""
    _installed[0] = environment


@contextlib.contextmanager
def using(environment: Environment) -> Iterator[Environment]:
    """Run the block (and the tasks it starts) in ``environment``."""
    token = _current.set(environment)
    try:
        yield environment
    finally:
        _current.reset(token)


async def send_record(topic: Any, key: bytes | None, value: bytes, headers: Headers = None, partition: int | None = None) -> None:
    """Send one encoded record to ``topic`` through the current outlet."""
    await current().outlet.send(topic, key, value, headers, partition)
