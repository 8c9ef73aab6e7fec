"""The acks of handled events (``WeirConsumer.ack_part``): counted as Faust's ``Message.ack`` then ``Consumer.ack`` count.

A message counts once the last channel holding it lets go (its reference count), only in the current consumer
generation, and not below the committed offset; any other ack (``WeirConsumer.ack``) never counts.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from faust.types.tuples import ConsumerMessage

from weir.app.engine.delivery import WeirConsumer

ORDERS = TP("weir.orders", 0)


def consumer(*, generation: int = 5, committed: int | None = None) -> Any:
    return SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=generation, topics=SimpleNamespace(acks_enabled_for=lambda topic: True)),
        _committed_offset=defaultdict(lambda: None, {ORDERS: committed}),
        _acked_index=defaultdict(set),
        _acked=defaultdict(list),
        _unacked_messages=set(),
        _n_acked=0,
        _waiting_for_ack=None,
        _weir_uncommitted=0,
        _weir_work=asyncio.Event(),
    )


def message(offset: int, *, generation: int = 5, refcount: int = 0) -> ConsumerMessage:
    found = ConsumerMessage(ORDERS.topic, ORDERS.partition, offset, None, 0, [], b"k", b"v", None, 1, 1, ORDERS, generation_id=generation)
    found.refcount = refcount
    return found


def test_handled_messages_count_once_in_the_current_generation_from_the_committed_offset() -> None:
    target = consumer(committed=1)
    messages = [message(0), message(1), message(2), message(3, generation=4)]
    WeirConsumer.ack_part(target, messages)
    WeirConsumer.ack_part(target, messages[1:2])  # acked twice: counted once
    assert target._acked[ORDERS] == [1, 2], "below the committed offset, or of an older generation: not counted"
    assert target._n_acked == 2
    assert all(found.acked for found in messages)
    assert target._weir_work.is_set()


def test_a_message_another_agent_s_channel_holds_counts_when_the_last_lets_go() -> None:
    target = consumer()
    shared = message(0, refcount=2)
    WeirConsumer.ack_part(target, [shared])
    assert not shared.acked
    assert target._acked[ORDERS] == []
    WeirConsumer.ack_part(target, [shared])
    assert shared.acked
    assert target._acked[ORDERS] == [0]


def test_any_other_ack_never_counts() -> None:
    target = consumer()
    skipped = message(0)
    assert WeirConsumer.ack(target, skipped) is False
    assert skipped.acked
    assert target._acked[ORDERS] == []
