"""A changelog partition Faust pauses is paused in aiokafka's fetcher too (``app.engine.fetcher.set_fetching``).

Faust only leaves a paused partition out of what it asks its client for: the fetcher kept fetching a
table's changelog after recovery, nobody consumed those records, and while they waited in its buffer the
fetcher sent no fetch to that broker (100 ms of every partition standing still).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.structs import TopicPartition

from weir.app.engine.fetcher import set_fetching

CHANGELOG = TopicPartition("weir-aggregates-changelog", 0)
OTHER = TopicPartition("weir-aggregates-changelog", 1)


def client_with(assigned: set[TopicPartition], buffered: dict[TopicPartition, str]) -> SimpleNamespace:
    subscription = SubscriptionState()
    subscription.assign_from_user(assigned)
    for tp in assigned:
        subscription.seek(tp, 0)
    return SimpleNamespace(_subscription=subscription, _fetcher=SimpleNamespace(_records=buffered))


def paused(client: SimpleNamespace, tp: TopicPartition) -> bool:
    return bool(client._subscription.subscription.assignment.state_value(tp).paused)


async def pause_then_resume() -> None:
    client = client_with({CHANGELOG}, {CHANGELOG: "the worker's own writes, fetched after recovery"})
    set_fetching(client, [CHANGELOG, OTHER], False)  # OTHER is not assigned here: left alone
    assert paused(client, CHANGELOG)
    assert CHANGELOG not in client._fetcher._records  # fetched again from its position once resumed
    set_fetching(client, [CHANGELOG], False)  # pausing twice is harmless
    set_fetching(client, [CHANGELOG], True)
    assert not paused(client, CHANGELOG)


def test_a_paused_changelog_partition_is_not_fetched_and_its_buffered_records_are_dropped() -> None:
    asyncio.run(pause_then_resume())  # a partition state makes its resume future in the running loop
