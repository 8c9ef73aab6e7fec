"""What a stage runs against: a clock and an outlet for its records. A worker's are the wall clock and the engine.

Every stateful stage reads the time, sleeps (a retry's backoff, a refused send's) and sends records only through
:func:`current`: a worker uses the defaults (:class:`WallClock`, the engine's transactional producer), and the test
driver (:mod:`app.testing`) swaps both for a virtual clock and in-memory topics with :func:`using`. Nothing else
differs between the two, so a behaviour the driver shows is the behaviour of the code a worker runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import faust

from app import engine

__all__ = ["Clock", "WallClock", "Outlet", "Environment", "current", "using", "send_record"]


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


class Outlet(Protocol):
    """Where records go instead of the engine's producer (the test driver's topics)."""

    #: the topic the dead letters go to
    dead_letters: str

    async def send(
        self, topic: str, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None, partition: int | None
    ) -> None:
        """Append one record to ``topic`` (to ``partition``, else by its key), in the current transaction."""
        ...

    def partitions(self, topic: str) -> int | None:
        """How many partitions ``topic`` has (None: unknown)."""
        ...


@dataclass(frozen=True)
class Environment:
    """A clock and an outlet (None: the engine, in a worker); ``record_limit``: the largest value sent (None: the worker's)."""

    clock: Clock
    outlet: Outlet | None = None
    record_limit: int | None = None


_WORKER = Environment(clock=WallClock())
_current: contextvars.ContextVar[Environment] = contextvars.ContextVar("weir_environment", default=_WORKER)


def current() -> Environment:
    """The environment of the code running now: a worker's, unless a test driver runs it."""
    return _current.get()


@contextlib.contextmanager
def using(environment: Environment) -> Iterator[Environment]:
    """Run the block (and the tasks it starts) in ``environment``."""
    token = _current.set(environment)
    try:
        yield environment
    finally:
        _current.reset(token)


async def send_record(
    topic: faust.TopicT, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]] | None = None, partition: int | None = None
) -> None:
    """Send one encoded record to ``topic``: through the engine in a worker (:func:`app.engine.send_record`), else the outlet."""
    outlet = _current.get().outlet
    if outlet is None:
        await engine.send_record(topic, key, value, headers, partition)
    else:
        await outlet.send(topic.get_topic_name(), key, value, headers, partition)
