"""A topology's stages served as Faust agents: each stage one agent on its source topics, and a tick timer per ticked topic."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from faust.types import StreamT

from weir.app.core import app, handle_parts, json_table, settings, topics
from weir.app.stages import Stage, Wiring
from weir.app.ticks import tick_every

__all__ = ["serve", "faust_topic", "worker_wiring"]


def faust_topic(*names: str) -> Any:
    """A channel of this worker over weir topics by their full names: raw bytes, partitioned like every topic weir declares."""
    return app.topic(*names, partitions=settings.partitions, key_serializer="raw", value_serializer="raw")


@functools.cache
def worker_wiring() -> Wiring:
    """This worker's wiring, one for all its topologies: its settings, Faust topics (one per name) and changelog-backed
    tables, its dead-letter topic; every topic a topology declares is created at start."""

    declared: dict[str, Any] = {}

    def declare(name: str) -> Any:
        if name not in declared:
            declared[name] = faust_topic(name)
            topics.extra.append(declared[name])
        return declared[name]

    return Wiring(settings=settings, topic=declare, table=json_table, dead_letters=topics.dead_letters)


def serve(stages: Iterable[Stage]) -> None:
    """Declare each stage as a Faust agent (:func:`app.core.handle_parts` on its sources, in batches of its own size and
    wait), its ticks and its timers."""
    for stage in stages:
        names = [topic.get_topic_name() for topic in stage.sources]
        channel = stage.sources[0] if len(names) == 1 else faust_topic(*names)

        async def agent(stream: StreamT[bytes], stage: Stage = stage) -> None:
            await handle_parts(
                stream,
                stage.handle_part,
                size=stage.batch_size,
                wait_ms=stage.batch_wait_ms,
                slice_most=1 if stage.runs_user_steps else None,
                concurrent=stage.concurrent_parts,
            )

        agent.__qualname__ = agent.__name__ = f"stage_{stage.name.replace('-', '_')}"
        app.agent(channel, name=stage.name)(agent)
        for topic in stage.ticked:
            tick_every(topic, stage.tick_every_ms, stage.tick_value)
        for timer in stage.timers:
            app.timer(interval=timer.every_s)(timer.run)
