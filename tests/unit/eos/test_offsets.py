"""Recovery's ListOffsets go on the consumer's coordination connections (app/engine/offsets.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.client import ConnectionGroup
from aiokafka.structs import TopicPartition

from weir.app.engine import offsets


class Client:
    """Records which connection group each request was sent on; everything else a fetcher asks of it is here too."""

    def __init__(self) -> None:
        self.groups: list[Any] = []
        self.cluster = self

    def leader_for_partition(self, partition: TopicPartition) -> int:
        return 1

    async def _maybe_wait_metadata(self) -> None:
        return None

    async def send(self, node_id: int, request: Any, *, group: Any = ConnectionGroup.DEFAULT) -> Any:
        self.groups.append(group)
        raise RuntimeError("stop here")  # the request was sent: what it was sent on is the point


class Consumer:
    def __init__(self, client: Client) -> None:
        from aiokafka.consumer.fetcher import Fetcher

        fetcher = object.__new__(Fetcher)
        fetcher._client = client
        fetcher._isolation_level = 1
        fetcher._retry_backoff = 0.0
        self._fetcher = fetcher
        self._client = client
        self._request_timeout_ms = 1000


def test_end_and_first_offsets_are_asked_on_the_coordination_connections() -> None:
    client = Client()
    consumer = Consumer(client)
    tp = TopicPartition("changelog", 0)
    asks = (
        offsets.end_offsets(consumer, [tp]),
        offsets.end_offsets(consumer, [tp], committed=True),
        offsets.end_offsets(consumer, [tp], committed=False),
        offsets.beginning_offsets(consumer, [tp]),
    )
    for ask in asks:
        with pytest.raises(RuntimeError, match="stop here"):
            asyncio.run(ask)
    assert client.groups == [ConnectionGroup.COORDINATION] * 4
    assert consumer._fetcher._client is client, "the consumer's own fetcher is left as it was"
    assert consumer._fetcher._isolation_level == 1
