"""A partition's first and end offsets, asked of the broker without waiting behind the consumer's fetch.

A broker answers the requests of one connection in order, one at a time, and a consumer's fetch that finds no new
records waits up to ``fetch_max_wait_ms`` (Faust sets 1.5 s) on its ordinary connection to that broker. aiokafka sends
``ListOffsets`` on that same connection, so each one a worker asked while restoring its tables waited up to 1.5 s
behind a fetch: a worker restarted under ``make chaos`` asked four (the changelogs' first offsets; their last stable
offsets and high watermarks until no transaction was open; their ends) and restored in 0.1-0.4 s or, behind
fetches, in 3-4.5 s. Here they go on the consumer's *coordination* connections (aiokafka's
``ConnectionGroup.COORDINATION``: the group's heartbeats and offset requests, answered at once).

aiokafka internals used: ``AIOKafkaConsumer._fetcher`` (copied, with its ``_client`` and ``_isolation_level``
replaced), ``_request_timeout_ms``, and ``client.send(..., group=)``.
"""

from __future__ import annotations

import copy
from typing import Any, cast

from aiokafka.client import ConnectionGroup
from aiokafka.structs import TopicPartition

__all__ = ["end_offsets", "beginning_offsets"]

READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class _CoordinationConnections:
    """An aiokafka client that sends every request on its coordination connections."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def send(self, node_id: int, request: Any, **_: Any) -> Any:
        return await self._client.send(node_id, request, group=ConnectionGroup.COORDINATION)


def _fetcher(consumer: Any, isolation_level: int) -> Any:
    fetcher = copy.copy(consumer._fetcher)
    fetcher._isolation_level = isolation_level
    fetcher._client = _CoordinationConnections(consumer._client)
    return fetcher


async def end_offsets(consumer: Any, partitions: list[TopicPartition], *, committed: bool | None = None) -> dict[TopicPartition, int]:
    """Each partition's end: its last stable offset (``committed``), else its high watermark; by default, the end
    the consumer's own ``end_offsets`` gives (its isolation level)."""
    level = consumer._fetcher._isolation_level if committed is None else READ_COMMITTED if committed else READ_UNCOMMITTED
    fetcher = _fetcher(consumer, level)
    return cast(dict[TopicPartition, int], await fetcher.end_offsets(partitions, consumer._request_timeout_ms))


async def beginning_offsets(consumer: Any, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Each partition's first offset (``AIOKafkaConsumer.beginning_offsets``)."""
    fetcher = _fetcher(consumer, consumer._fetcher._isolation_level)
    return cast(dict[TopicPartition, int], await fetcher.beginning_offsets(partitions, consumer._request_timeout_ms))
