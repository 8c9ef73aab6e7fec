"""An agent's batches: from its inbox (:mod:`app.engine.inbox`), or taken from a Faust stream's channel (Faust's
``noack_take``, without its timer, on Faust's Stream internals)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, cast

from faust.types import EventT, StreamT

from weir.app.engine.config import installed
from weir.app.engine.inbox import inbox_batches, open_inbox

__all__ = ["batches", "take_ready"]

log = logging.getLogger(__name__)


async def batches(stream: StreamT[bytes], max_: int, within: float) -> AsyncIterator[list[EventT[bytes]]]:
    """An agent's batches of up to ``max_`` events, each handed on as soon as no further event is ready; not acked.

    From the agent's inbox with ``EngineConfig.direct_batches`` (when its topics can have one), else from the
    stream (:func:`take_ready`: ``within`` bounds how long it sleeps between looks).
    """
    inbox = open_inbox(stream, limit=max(2 * max_, stream.app.conf.stream_buffer_maxsize)) if installed().direct_batches else None
    if inbox is None:
        async for batch in take_ready(stream, max_, within):
            yield batch
        return
    async for batch in inbox_batches(inbox, max_):
        yield batch


async def take_ready(stream: StreamT[bytes], max_: int, within: float) -> AsyncIterator[list[EventT[bytes]]]:
    """Adaptive batches: up to ``max_`` events, handed on as soon as no further event is ready.

    Faust's ``noack_take`` waits ``within`` for a batch to fill, so under a light load every event of
    every hop waited for that timer. Here a batch is handed on when it is full *or* the stream's queue is
    empty after an event was added: under a backlog batches fill (the consumer delivers a whole fetch
    before the stream runs), under a light load an event goes on at once. ``within`` only bounds how long
    the loop sleeps between looks. Events are not acked here (Faust's ``noack_take`` contract): the
    caller acks them inside their exactly-once scope. Otherwise the code of Faust 0.15's ``noack_take``,
    with the Stream internals it uses: a processor added to the stream (it runs with the stream's current
    event set), the stream's passive mode on its channel iterator (``_enable_passive``), and the removal of
    that processor at the end (``_processors``).
    """
    faust_stream = cast(Any, stream)
    buffer: list[EventT[bytes]] = []
    buffer_full = asyncio.Event()
    buffer_consumed = asyncio.Event()
    buffer_consuming: asyncio.Future[None] | None = None
    channel_it = aiter(faust_stream.channel)
    enable_acks = faust_stream.enable_acks

    async def add_to_buffer(value: Any) -> Any:
        nonlocal buffer_consuming
        try:
            if buffer_consuming is not None:
                try:
                    await buffer_consuming
                finally:
                    buffer_consuming = None
            event = faust_stream.current_event
            if event is None:
                raise RuntimeError("take_ready: the stream has no current event")
            buffer.append(event)
            if len(buffer) >= max_ or channel_it.empty():
                buffer_full.set()
                buffer_consumed.clear()
                await faust_stream.wait(buffer_consumed)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("take_ready: error adding to the batch: %r", error)
            await faust_stream.crash(error)
        return value

    faust_stream.enable_acks = False
    faust_stream.add_processor(add_to_buffer)
    faust_stream._enable_passive(channel_it)
    try:
        while not faust_stream.should_stop:
            await faust_stream.wait_for_stopped(buffer_full, timeout=within)
            if not buffer:
                continue
            buffer_consuming = asyncio.get_running_loop().create_future()
            try:
                yield list(buffer)
            finally:
                buffer.clear()
                if buffer_consuming is not None and not buffer_consuming.done():
                    buffer_consuming.set_result(None)
                buffer_full.clear()
                buffer_consumed.set()
    finally:
        faust_stream.enable_acks = enable_acks
        faust_stream._processors.remove(add_to_buffer)
