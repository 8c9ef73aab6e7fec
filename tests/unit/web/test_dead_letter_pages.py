"""Pages of the dead-letter topic: the cursor, the merge across partitions, and the reader on a fake consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app import dead_letter_pages, web
from weir.app.dead_letter_pages import DeadLetterReader, Window, format_before, merge_newest, parse_before
from weir.app.web import decode_dead_letter

TOPIC = "weir.dead-letters"


def entry(partition: int, offset: int, time_ms: int) -> dict[str, Any]:
    return {"partition": partition, "offset": offset, "timestamp_ms": time_ms, "failed_ms": time_ms}


# ------------------------------------------------------------------------------------------ the cursor


def test_before_reads_partition_offset_pairs_and_writes_them_back() -> None:
    assert parse_before("", 4) == {}
    assert parse_before("0:120,3:7,1:0", 4) == {0: 120, 3: 7, 1: 0}
    assert format_before({3: 7, 0: 120, 1: 0}) == "0:120,1:0,3:7"


@pytest.mark.parametrize("raw", ["0", "0:", "x:1", "4:10", "-1:3", "0:-2", "0:1,0:2", "0:1;1:2"])
def test_a_before_out_of_shape_names_the_expected_shape(raw: str) -> None:
    with pytest.raises(ValueError, match=r"before=.*expected <partition>:<offset> pairs .* from 0 to 3"):
        parse_before(raw, 4)


# ------------------------------------------------------------------------------------------- the merge


def test_the_merge_takes_the_latest_failures_first_across_partitions() -> None:
    windows = [
        Window(partition=0, start=0, low=0, high=3, entries=[entry(0, 0, 100), entry(0, 1, 300), entry(0, 2, 500)]),
        Window(partition=1, start=0, low=0, high=2, entries=[entry(1, 0, 200), entry(1, 1, 400)]),
    ]
    page = merge_newest(windows, 3)
    assert [(e["partition"], e["offset"]) for e in page.entries] == [(0, 2), (1, 1), (0, 1)]
    assert page.next_before == {0: 1, 1: 1}
    rest = merge_newest(
        [
            Window(partition=0, start=0, low=0, high=1, entries=[entry(0, 0, 100)]),
            Window(partition=1, start=0, low=0, high=1, entries=[entry(1, 0, 200)]),
        ],
        3,
    )
    assert [(e["partition"], e["offset"]) for e in rest.entries] == [(1, 0), (0, 0)]
    assert rest.next_before is None


def test_a_partition_taken_in_offset_order_even_when_its_clocks_disagree() -> None:
    # offset 1 failed before offset 0: the page still takes the partition from its top, so pages stay disjoint
    window = Window(partition=0, start=0, low=0, high=2, entries=[entry(0, 0, 900), entry(0, 1, 100)])
    page = merge_newest([window], 1)
    assert [e["offset"] for e in page.entries] == [1]
    assert page.next_before == {0: 1}


def test_the_merge_stops_where_a_partition_has_unread_older_records() -> None:
    windows = [
        Window(partition=0, start=0, low=40, high=42, entries=[entry(0, 41, 500)]),  # more below offset 40, not read
        Window(partition=1, start=0, low=0, high=3, entries=[entry(1, 0, 100), entry(1, 1, 200), entry(1, 2, 300)]),
    ]
    page = merge_newest(windows, 10)
    assert [(e["partition"], e["offset"]) for e in page.entries] == [(0, 41)]
    assert page.next_before == {0: 40, 1: 3}


def test_a_window_of_markers_only_still_moves_the_cursor() -> None:
    page = merge_newest([Window(partition=0, start=0, low=500, high=1000)], 10)
    assert page.entries == []
    assert page.next_before == {0: 500}


# ------------------------------------------------------------------------------- the reader, on a fake


class FakeConsumer:
    """Enough of AIOKafkaConsumer for the reader: offsets between records are transaction markers."""

    instances: list[FakeConsumer] = []  # noqa: RUF012  (a test's record of what the reader started)
    FETCH_OFFSETS = 7  # a fetch answers this many offsets at most, as a broker answers a batch

    def __init__(self, log: Mapping[int, Sequence[tuple[int, int]]], starts: Mapping[int, int], ends: Mapping[int, int]) -> None:
        self.log, self.starts, self.ends = log, starts, ends
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.stopped = False
        self.fetched_offsets = 0
        FakeConsumer.instances.append(self)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, tps: list[TopicPartition]) -> None:
        self.positions = {tp: self.starts[tp.partition] for tp in tps}

    def pause(self, *tps: TopicPartition) -> None:
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused.difference_update(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.starts[tp.partition] for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.ends[tp.partition] for tp in tps}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    async def getmany(self, *tps: TopicPartition, timeout_ms: int) -> dict[TopicPartition, list[Any]]:
        answer = {}
        for tp in tps:
            assert tp not in self.paused, f"{tp} read while paused"
            low = self.positions[tp]
            high = min(low + self.FETCH_OFFSETS, self.ends[tp.partition])
            self.fetched_offsets += high - low
            answer[tp] = [
                SimpleNamespace(offset=offset, timestamp=time_ms, value=b'{"reason": "undecodable", "failed_ms": %d}' % time_ms)
                for offset, time_ms in self.log[tp.partition]
                if low <= offset < high
            ]
            self.positions[tp] = high
        return answer


def fake_reader(
    monkeypatch: pytest.MonkeyPatch, log: Mapping[int, Sequence[tuple[int, int]]], starts: Mapping[int, int], ends: Mapping[int, int]
) -> DeadLetterReader:
    FakeConsumer.instances = []
    monkeypatch.setattr(dead_letter_pages, "AIOKafkaConsumer", lambda **_: FakeConsumer(log, starts, ends))
    return DeadLetterReader("127.0.0.1:1", {}, decode_dead_letter)


def all_pages(reader: DeadLetterReader, partitions: int, limit: int, *, most: int = 10_000) -> list[list[tuple[int, int]]]:
    async def follow() -> list[list[tuple[int, int]]]:
        pages: list[list[tuple[int, int]]] = []
        before: dict[int, int] = {}
        for _ in range(most):
            page = await reader.page(TOPIC, partitions, before, limit)
            pages.append([(e["partition"], e["offset"]) for e in page.entries])
            if page.next_before is None:
                return pages
            before = page.next_before
        raise AssertionError(f"no end after {most} pages")

    return asyncio.run(follow())


@st.composite
def topics(draw: st.DrawFn) -> tuple[dict[int, list[tuple[int, int]]], dict[int, int], dict[int, int]]:
    """Partitions whose records have gaps (markers, aborted records), a start above 0 (retention) and any clocks."""
    partitions = draw(st.integers(1, 4))
    log, starts, ends = {}, {}, {}
    for partition in range(partitions):
        start = draw(st.integers(0, 30))
        offsets = sorted(draw(st.sets(st.integers(start, start + 200), max_size=60)))
        log[partition] = [(offset, draw(st.integers(1_000, 1_100))) for offset in offsets]
        starts[partition] = start
        ends[partition] = draw(st.integers((offsets[-1] + 1) if offsets else start, start + 260))
    return log, starts, ends


@settings(max_examples=150, deadline=None)
@given(topic=topics(), limit=st.integers(1, 12))
def test_pages_followed_to_the_end_are_disjoint_and_cover_every_record(
    topic: tuple[dict[int, list[tuple[int, int]]], dict[int, int], dict[int, int]], limit: int
) -> None:
    log, starts, ends = topic
    with pytest.MonkeyPatch.context() as monkeypatch:
        reader = fake_reader(monkeypatch, log, starts, ends)
        pages = all_pages(reader, len(log), limit)
    taken = [record for page in pages for record in page]
    assert len(taken) == len(set(taken)), "a record on two pages"
    assert sorted(taken) == sorted((partition, offset) for partition, records in log.items() for offset, _ in records)
    assert all(len(page) <= limit for page in pages)
    for partition in log:
        offsets = [offset for p, offset in taken if p == partition]
        assert offsets == sorted(offsets, reverse=True), "a partition is paged newest offset first"
    assert len(FakeConsumer.instances) == reader.started == 1


def test_a_page_of_a_long_topic_reads_a_bounded_part_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 100k records behind a marker each: a page of 50 reads about two hundred offsets, not the topic
    log = {0: [(offset, 1_000 + offset) for offset in range(0, 200_000, 2)]}
    reader = fake_reader(monkeypatch, log, {0: 0}, {0: 200_000})

    async def two_pages() -> tuple[Any, Any]:
        first = await reader.page(TOPIC, 1, {}, 50)
        assert first.next_before is not None
        return first, await reader.page(TOPIC, 1, first.next_before, 50)

    first, second = asyncio.run(two_pages())
    assert [e["offset"] for e in first.entries] == list(range(199_998, 199_898, -2))
    assert [e["offset"] for e in second.entries] == list(range(199_898, 199_798, -2))
    [consumer] = FakeConsumer.instances
    assert consumer.fetched_offsets < 600
    assert consumer.paused == {TopicPartition(TOPIC, 0)}, "idle between pages"


def test_one_consumer_serves_every_page_until_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = fake_reader(monkeypatch, {0: [(0, 1_000)], 1: []}, {0: 0, 1: 0}, {0: 1, 1: 0})

    async def run() -> None:
        for _ in range(3):
            page = await reader.page(TOPIC, 2, {}, 10)
            assert [e["offset"] for e in page.entries] == [0]
        await reader.stop()

    asyncio.run(run())
    [consumer] = FakeConsumer.instances
    assert consumer.stopped
    assert (reader.started, reader.pages) == (1, 3)


def test_a_failed_read_closes_the_consumer_and_the_next_page_starts_another(monkeypatch: pytest.MonkeyPatch) -> None:
    reader = fake_reader(monkeypatch, {0: [(0, 1_000)]}, {0: 0}, {0: 1})

    async def broken(*_: Any, **__: Any) -> Any:
        raise ConnectionError("broker gone")

    async def run() -> None:
        await reader.page(TOPIC, 1, {}, 10)
        FakeConsumer.instances[0].end_offsets = broken  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await reader.page(TOPIC, 1, {}, 10)
        assert FakeConsumer.instances[0].stopped
        page = await reader.page(TOPIC, 1, {}, 10)
        assert [e["offset"] for e in page.entries] == [0]

    asyncio.run(run())
    assert reader.started == 2


def test_the_html_page_links_the_older_page_and_back_to_the_newest() -> None:
    data = {"topic": TOPIC, "worker": "w", "now_ms": 1_000, "limit": 7, "before": None, "next": "0:12,1:3", "dead_letters": []}
    newest = web.render_dead_letters(data)
    assert '<a href="?limit=7&amp;before=0%3A12%2C1%3A3">older</a>' in newest
    assert ">newest</a>" not in newest
    last = web.render_dead_letters({**data, "before": "0:12,1:3", "next": None})
    assert '<a href="?limit=7">newest</a>' in last
    assert ">older</a>" not in last
