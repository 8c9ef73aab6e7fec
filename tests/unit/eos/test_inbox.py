"""An agent's inbox (``app.engine.inbox``): records straight from the delivery loop, taken as batches.

Pure tests on a stand-in app (Faust's own ``Event`` and ``ConsumerMessage``); the real delivery loop, with the
broker, runs every integration test on inboxes (``WEIR_DIRECT_BATCHES=1`` is the default).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
from faust.types import TP
from faust.types.tuples import ConsumerMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app.engine import inbox as inboxes
from weir.app.engine.inbox import Inbox, inbox_batches, open_inbox

ORDERS = "weir.orders"


def fake_app() -> Any:
    return SimpleNamespace(monitor=SimpleNamespace(stream_inbound_time={}), conf=SimpleNamespace(Event=faust.Event))


def message(partition: int, offset: int) -> ConsumerMessage:
    tp = TP(ORDERS, partition)
    return ConsumerMessage(ORDERS, partition, offset, None, 0, [("h", b"1")], b"k", f"{partition}:{offset}".encode(), None, 1, 1, tp)


def test_records_are_taken_in_delivery_order_as_events_of_the_record() -> None:
    async def run() -> None:
        box = Inbox(fake_app(), [ORDERS], limit=100)
        for offset in range(3):
            box.put(message(1, offset))
        batch = await box.take(10)
        assert [event.value for event in batch] == [b"1:0", b"1:1", b"1:2"]
        first = batch[0]
        assert (first.key, first.message.tp, first.message.offset, first.headers) == (b"k", TP(ORDERS, 1), 0, {"h": b"1"})
        assert TP(ORDERS, 1) in box.app.monitor.stream_inbound_time  # Faust's slow-stream check sees it processing
        assert box.events == []

    asyncio.run(run())


def test_a_take_waits_for_a_record_and_gets_it_at_once() -> None:
    async def run() -> None:
        box = Inbox(fake_app(), [ORDERS], limit=100)
        taking = asyncio.ensure_future(box.take(10))
        await asyncio.sleep(0.01)
        assert not taking.done()
        box.put(message(0, 7))
        batch = await asyncio.wait_for(taking, 1.0)
        assert [event.message.offset for event in batch] == [7]

    asyncio.run(run())


def test_a_full_inbox_holds_the_delivery_loop_until_the_agent_takes() -> None:
    async def run() -> None:
        box = Inbox(fake_app(), [ORDERS], limit=3)
        for offset in range(3):
            box.put(message(0, offset))
        assert box.full()
        waiting = asyncio.ensure_future(box.wait_space())
        await asyncio.sleep(0.01)
        assert not waiting.done(), "no room: the delivery loop waits"
        assert len(await box.take(2)) == 2
        await asyncio.wait_for(waiting, 1.0)
        assert not box.full()

    asyncio.run(run())


def test_records_of_revoked_partitions_are_dropped_and_the_rest_stay_in_order() -> None:
    async def run() -> None:
        box = Inbox(fake_app(), [ORDERS], limit=4)
        for offset in range(2):
            box.put(message(0, offset))
            box.put(message(1, offset))
        assert box.full()
        box.drop({TP(ORDERS, 1)})
        assert not box.full()
        assert [(event.message.partition, event.message.offset) for event in await box.take(10)] == [(0, 0), (0, 1)]
        box.drop({TP(ORDERS, 0)})  # nothing left: harmless

    asyncio.run(run())


@settings(max_examples=60, deadline=None)
@given(
    puts=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30)), min_size=1, max_size=12),
    max_=st.integers(1, 40),
    limit=st.integers(1, 50),
)
def test_every_record_is_taken_once_in_order_in_batches_of_at_most_max(puts: list[tuple[int, int]], max_: int, limit: int) -> None:
    """Deliveries (with waits for room, as the delivery loop does) and takes interleaved: each record once, in order."""

    async def run() -> None:
        box = Inbox(fake_app(), [ORDERS], limit=limit)
        delivered: list[tuple[int, int]] = []
        taken: list[tuple[int, int]] = []
        next_offset = dict.fromkeys(range(4), 0)

        async def deliver() -> None:
            for partition, count in puts:
                for _ in range(count):
                    if box.full():
                        await box.wait_space()
                    offset = next_offset[partition]
                    next_offset[partition] += 1
                    box.put(message(partition, offset))
                    delivered.append((partition, offset))
                await asyncio.sleep(0)

        async def take() -> None:
            total = sum(count for _, count in puts)
            while len(taken) < total:
                batch = await box.take(max_)
                assert 1 <= len(batch) <= max_
                taken.extend((event.message.partition, event.message.offset) for event in batch)

        await asyncio.wait_for(asyncio.gather(deliver(), take()), 5.0)
        assert taken == delivered

    asyncio.run(run())


def _stream(app: Any, channel: Any) -> Any:
    return SimpleNamespace(app=app, channel=channel)


def _topic(app: Any, name: str, *, value_serializer: str | None = None) -> Any:
    class Topic(SimpleNamespace):
        iterated = 0

        def __aiter__(self) -> Any:
            self.iterated += 1
            return self

    return Topic(app=app, topics=(name,), pattern=None, key_serializer=None, value_serializer=value_serializer)


def test_an_inbox_serves_only_a_raw_topic_no_other_agent_reads_and_outlives_its_actor(monkeypatch: Any) -> None:
    monkeypatch.setattr(inboxes, "_inboxes", {})
    app = fake_app()
    app.conf = SimpleNamespace(key_serializer="raw", value_serializer="raw", Event=faust.Event)
    orders, shared, json_topic = _topic(app, ORDERS), _topic(app, "weir.shared"), _topic(app, "weir.json", value_serializer="json")
    app.agents = {"a": SimpleNamespace(channel=orders), "b": SimpleNamespace(channel=shared), "c": SimpleNamespace(channel=shared)}

    box = open_inbox(_stream(app, orders), limit=10)
    assert box is not None
    assert inboxes.inbox_for(ORDERS) is box
    assert orders.iterated == 1, "the channel is iterated once: that subscribes the worker to the topic"
    assert open_inbox(_stream(app, shared), limit=10) is None, "two agents read it: Faust's conductor serves both"
    assert open_inbox(_stream(app, json_topic), limit=10) is None, "not raw records: Faust's codec decodes them"

    async def restart_the_agent() -> None:
        box.put(message(0, 0))
        async for batch in inbox_batches(box, 10):  # an actor that takes a batch, then raises
            assert len(batch) == 1
            break
        box.put(message(0, 1))  # delivered while Faust's supervisor restarts the actor
        again = open_inbox(_stream(app, orders), limit=10)
        assert again is box, "the restarted actor takes the same inbox"
        assert [event.message.offset for event in await again.take(10)] == [1]

    asyncio.run(restart_the_agent())
    assert inboxes.inbox_for(ORDERS) is box
