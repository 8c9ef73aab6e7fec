"""The seek to the committed offsets when recovery ends (``WeirConsumer.perform_seek``) never goes below what the
consumer committed itself in its generation.

The group coordinator answers with the last stable offset: an offset this worker committed in a transaction a moment
before is not stable until the transaction's marker reaches the offsets topic. In a chaos run the answer was the
offset before the worker's last commit; taken as the committed offset, it made the next commit move the group's
offset back below processed events, and the next owner processed them again. A traced run showed it: commit to 12,
then ``seek-from-10``, then a commit to 11 in the transaction that held event 13's outputs.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from weir.app.engine.delivery import WeirConsumer

RESUME = TP("weir.flow.dispatch.resume", 1)
ORDERS = TP("weir.orders", 0)
CHANGELOG = TP("weir.aggregates-changelog", 0)


def consumer(answer: dict[TP, int | None], committed: dict[TP, int | None]) -> Any:
    sought: dict[TP, int] = {}

    async def seek_to_committed() -> dict[TP, int | None]:
        return dict(answer)

    async def seek(tp: TP, offset: int) -> None:
        sought[tp] = offset

    target = SimpleNamespace(
        app=SimpleNamespace(
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True), tables=SimpleNamespace(changelog_topics={CHANGELOG.topic})
        ),
        _committed_offset=defaultdict(lambda: None, committed),
        _read_offset={},
        _acked=defaultdict(list),
        _gap={},
        _next={},
        _moved=lambda: None,
        seek_to_committed=seek_to_committed,
        _seek=seek,
        sought=sought,
    )
    target._after_handled = lambda tp, start: WeirConsumer._after_handled(target, tp, start)
    return target


def test_a_stale_answer_below_the_consumers_own_commit_is_raised_to_it_and_the_fetch_position_with_it() -> None:
    target = consumer({RESUME: 10, ORDERS: 7}, {RESUME: 12, ORDERS: 7})
    asyncio.run(WeirConsumer.perform_seek(target))
    assert target._committed_offset[RESUME] == 12, "the consumer's committed offset never moves back"
    assert target._next[RESUME] == 12, "delivery goes on after what was committed"
    assert target.sought == {RESUME: 12}, "the fetch position too; a partition whose answer agrees is left alone"
    assert (target._committed_offset[ORDERS], target._next[ORDERS]) == (7, 7)


def test_a_partition_this_consumer_committed_nothing_for_takes_the_coordinators_answer() -> None:
    target = consumer({RESUME: 10, ORDERS: None}, {})
    asyncio.run(WeirConsumer.perform_seek(target))
    assert (target._committed_offset[RESUME], target._next[RESUME], target.sought) == (10, 10, {})
    assert target._next[ORDERS] == 0, "no committed offset: from the beginning"


def test_an_answer_ahead_of_the_consumers_books_is_taken() -> None:
    target = consumer({RESUME: 20}, {RESUME: 12})
    asyncio.run(WeirConsumer.perform_seek(target))
    assert (target._committed_offset[RESUME], target._next[RESUME], target.sought) == (20, 20, {})


def test_a_changelog_partition_keeps_the_position_its_restore_left() -> None:
    target = consumer({ORDERS: 7, CHANGELOG: None}, {})
    target._next[CHANGELOG] = 31  # the restore read it up to offset 30
    asyncio.run(WeirConsumer.perform_seek(target))
    assert target._next == {ORDERS: 7, CHANGELOG: 31}, "no committed offset for a changelog: not 'from the beginning'"
