"""Delivery checks of the exactly-once consumer: holes (SkippedOffsets) and copies delivered again (first_delivery)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from weir.app.engine import delivery
from weir.app.engine.fetcher import SkippedOffsets, note_skipped_offsets, skipped_offsets


def test_a_hole_is_covered_only_by_ranges_a_fetch_stepped_over() -> None:
    skipped = SkippedOffsets()
    skipped.note("t", 0, 14, 15)  # a transaction marker at 14
    assert skipped.covers("t", 0, 14, 15)
    assert not skipped.covers("t", 0, 13, 15), "offset 13 was not stepped over: a record nobody delivered"
    assert not skipped.covers("t", 0, 14, 16)
    assert not skipped.covers("t", 1, 14, 15), "another partition"
    skipped.note("t", 0, 15, 20)  # an aborted transaction right after it
    assert skipped.covers("t", 0, 14, 20)
    skipped.note("t", 0, 30, 31)
    assert not skipped.covers("t", 0, 14, 31), "20..29 were delivered or never fetched"


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 20)), max_size=40), st.integers(0, 220), st.integers(1, 30))
def test_covers_agrees_with_the_set_of_noted_offsets(ranges: list[tuple[int, int]], begin: int, length: int) -> None:
    skipped = SkippedOffsets()
    noted: set[int] = set()
    for start, size in ranges:
        skipped.note("t", 3, start, start + size)
        noted.update(range(start, start + size))
    assert skipped.covers("t", 3, begin, begin + length) == all(offset in noted for offset in range(begin, begin + length))


def _event(partition: int, offset: int, generation: int, committed: int | None = None) -> Any:
    message = SimpleNamespace(tp=TP("t", partition), offset=offset, generation_id=generation)
    consumer = SimpleNamespace(_committed_offset={TP("t", partition): committed})
    return SimpleNamespace(message=message, app=SimpleNamespace(consumer=consumer))


def test_an_offset_is_processed_once_per_generation_whatever_the_order() -> None:
    delivery._processed.clear()
    assert [delivery.first_delivery(_event(0, offset, 1)) for offset in (5, 7, 6)] == [True, True, True], "concurrency: out of order"
    assert not delivery.first_delivery(_event(0, 6, 1)), "a copy delivered again by a seek"
    assert delivery.first_delivery(_event(1, 6, 1)), "another partition"
    assert delivery.first_delivery(_event(0, 6, 2)), "a new generation starts from the committed offset: everything is new"
    assert not delivery.first_delivery(_event(0, 6, 2))


def _batch(base_offset: int, count: int, *, producer_id: int) -> bytearray:
    import struct

    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    transactional = producer_id >= 0
    builder = DefaultRecordBatchBuilder(
        2, 0, int(transactional), producer_id, 0 if transactional else -1, 0 if transactional else -1, 1 << 20
    )
    for delta in range(count):
        builder.append(delta, timestamp=0, key=b"k", value=b"v", headers=[])
    buffer = builder.build()
    struct.pack_into(">q", buffer, 0, base_offset)  # the broker's base offset (outside the batch's CRC)
    return buffer


def test_a_read_committed_fetch_notes_the_aborted_records_it_steps_over() -> None:
    from aiokafka.consumer import fetcher
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    note_skipped_offsets()
    # offsets 0-2: a transaction of producer 7 that aborted; 3-4: plain records
    data = bytes(_batch(0, 3, producer_id=7) + _batch(3, 2, producer_id=-1))
    records = fetcher.PartitionRecords(
        TopicPartition("aborted-topic", 0), MemoryRecords(data), [(7, 0)], 0, None, None, True, fetcher.READ_COMMITTED
    )
    assert [record.offset for record in records] == [3, 4]
    assert skipped_offsets.covers("aborted-topic", 0, 0, 3), "the aborted records were stepped over by the fetch"
    assert not skipped_offsets.covers("aborted-topic", 0, 0, 4)
