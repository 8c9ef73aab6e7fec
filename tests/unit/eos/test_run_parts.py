"""How an agent handles a batch (app.core.run_parts): in offset order per partition, by one actor, at once when asked."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.types import TP

from examples.eof_orders import ORDERS
from weir import Application, Flow, Settings, Window, WindowSpec, count
from weir.app import core, engine, shell
from weir.app.engine import delivery
from weir.app.runtime import environment
from weir.app.settings import AGENT_NAMES, OPTIONAL_AGENT_NAMES


class _Event:
    """Just enough of a Faust event for run_parts (an instance can be weakly referenced, as part scopes do)."""

    def __init__(self, partition: int, offset: int) -> None:
        self.message = SimpleNamespace(tp=TP("t", partition), offset=offset, generation_id=1, value=b"null")
        self.app = SimpleNamespace(consumer_generation_id=1, consumer=SimpleNamespace(_committed_offset={}))
        self.acked = False

    def ack(self) -> bool:
        self.acked = True
        return True


def _batch(*offsets: tuple[int, int]) -> list[Any]:
    delivery._processed.clear()
    return [_Event(partition, offset) for partition, offset in offsets]


def test_concurrent_parts_run_at_once_each_in_its_own_part_scope() -> None:
    events = _batch((0, 10), (1, 20), (0, 11), (1, 21))
    started: list[Any] = []
    both = asyncio.Event()

    async def handle_part(part: Any) -> None:
        started.append((part, faust.current_event()))
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), timeout=2.0)  # one part at a time never gets here: a timeout
        assert not any(event.acked for event in part), "a part is acked after it is handled, not before"

    asyncio.run(core.run_parts(events, handle_part, concurrent=True))
    assert [[event.message.offset for event in part] for part, _ in started] == [[10, 11], [20, 21]]
    assert [current for _, current in started] == [part[-1] for part, _ in started], "each task's current event is its part's last"
    assert all(event.acked for event in events)


def test_without_concurrent_the_parts_run_one_after_the_other() -> None:
    events = _batch((0, 1), (1, 1), (0, 2))
    running: list[int] = []
    overlap: list[int] = []

    async def handle_part(part: Any) -> None:
        running.append(1)
        overlap.append(len(running))
        await asyncio.sleep(0.01)
        running.pop()

    asyncio.run(core.run_parts(events, handle_part))
    assert overlap == [1, 1]
    assert all(event.acked for event in events)


def test_a_failing_part_cancels_the_others_and_nothing_of_it_is_acked() -> None:
    events = _batch((0, 1), (1, 1))
    cancelled: list[bool] = []

    async def handle_part(part: Any) -> None:
        if part[0].message.tp.partition == 0:
            await asyncio.sleep(0)
            raise RuntimeError("broken")
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with pytest.raises(RuntimeError, match="broken"):
        asyncio.run(core.run_parts(events, handle_part, concurrent=True))
    assert cancelled == [True]
    assert not any(event.acked for event in events)


def test_a_concurrent_part_handles_its_events_at_once_and_dead_letters_each_failure_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    events = _batch((0, 1), (0, 2), (0, 3))
    for event in events:
        event.message.value = b'{"n": %d}' % event.message.offset
    in_flight: list[int] = []
    all_in = asyncio.Event()
    dead: list[Any] = []

    async def handler(event: Any, value: Any) -> None:
        in_flight.append(value["n"])
        if len(in_flight) == 3:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), timeout=2.0)
        if value["n"] == 2:
            raise ValueError("bad item")

    async def dead_letter(event: Any, **fields: Any) -> None:
        dead.append((event.message.offset, fields["reason"]))

    monkeypatch.setattr(shell, "send_dead_letter", dead_letter)
    asyncio.run(core.handle_part_events(events, agent="items", what="item", handler=handler, concurrent=True))
    assert sorted(in_flight) == [1, 2, 3]
    assert dead == [(2, "error")]


def test_a_worker_refuses_an_agent_with_several_actors() -> None:
    agent = SimpleNamespace(name="items", concurrency=8)
    with pytest.raises(RuntimeError, match=r"'items' runs 8 actors .* under exactly_once"):
        core.refuse_out_of_order_agents([SimpleNamespace(name="ok", concurrency=1), agent])


def test_every_agent_weir_ships_runs_one_actor() -> None:
    """Every agent set of weir's on one application (the shop's: tests/unit/shop/test_agents.py)."""
    names = (*AGENT_NAMES, *OPTIONAL_AGENT_NAMES)
    application = Application(
        Settings(agents=names, app_id="unit-one-actor"),
        flows=[Flow("f", source="f-in").to("f-out")],
        windows=[Window("w", source="w-in", to="w-out", spec=WindowSpec.tumbling(1_000), initial=0, fold=count)],
        eof_jobs={"": ORDERS},
    )
    try:
        app = application.serve_agents()
        served = {agent.name for agent in app.agents.values()}
        assert len(served) >= len(names), f"agent sets {names} served as {sorted(served)}"
        assert all(agent.concurrency == 1 for agent in app.agents.values())
        core.refuse_out_of_order_agents(app.agents.values())
    finally:
        environment.install(environment.STANDALONE)


def test_a_slow_batch_runs_in_slices_of_its_budget_with_a_due_commit_between_them() -> None:
    """A batch whose events take 20 ms each, a budget of 0.1 s: slices of about 5 events after the first, and a
    commit that closes the gate between two slices runs before the next slice (a batch is one transaction)."""
    events = _batch(*[(number % 2, number) for number in range(30)])
    slices: list[list[int]] = []
    committed: list[int] = []

    async def handle_part(part: Any) -> None:
        for _ in part:
            await asyncio.sleep(0.02)

    async def run() -> None:
        slicer = core.Slicer(500, first=10, budget_s=0.1)

        async def each(part: Any) -> None:
            slices.append([event.message.offset for event in part])
            await handle_part(part)

        async def commit_when_idle() -> None:
            await engine.gate.idle_event.wait()
            while True:  # the first time the gate goes idle with events left: a commit
                await asyncio.sleep(0)
                if len(slices) and len(slices) < 30:
                    async with engine.gate.committing():
                        committed.append(sum(event.acked for event in events))
                    return

        committer = asyncio.ensure_future(commit_when_idle())
        await core.run_sliced(events, each, slicer)
        await committer

    asyncio.run(run())
    handled = [offset for part in slices for offset in part]
    assert sorted(handled) == list(range(30))
    firsts = {len(part) for part in slices[:2]}
    assert firsts == {5}, f"the first slice of 10 events (its two parts of 5) ran as one: {slices[:2]}"
    assert all(len(part) <= 4 for part in slices[2:]), f"later slices fit the 0.1 s budget at 20 ms an event: {slices}"
    assert committed, "no commit ran between two slices"
    assert 0 < committed[0] < 30, "the commit came while events were left, and covers only handled ones"
    assert all(event.acked for event in events)


def test_a_fast_batch_grows_to_its_full_size_at_most_twofold_a_slice() -> None:
    slicer = core.Slicer(500, first=50, budget_s=1.0)
    sizes = []
    for _ in range(5):
        slicer.took(slicer.size, 0.01)
        sizes.append(slicer.size)
    assert sizes == [100, 200, 400, 500, 500]
    slicer.took(500, 5.0)
    assert slicer.size == 100
    slicer.took(1, 30.0)
    assert slicer.size == 1


def test_a_slice_of_skipped_events_leaves_the_size_alone() -> None:
    """Events skipped without running (older generation, rebalance hold) take no time: they must not make the
    next slice as large as the batch."""
    slicer = core.Slicer(500, first=1, budget_s=1.0)
    slicer.took(1, 0.2)
    assert slicer.size == 2
    slicer.took(0, 0.0001)
    assert slicer.size == 2


def test_skipped_events_do_not_count_as_run() -> None:
    """run_parts says how many events ran; events of an older consumer generation are acked, not run."""
    events = _batch((0, 1), (0, 2), (1, 1))
    events[0].message.generation_id = 0
    events[2].message.generation_id = 0
    ran: list[int] = []

    async def handle_part(part: Any) -> None:
        ran.extend(event.message.offset for event in part)

    assert asyncio.run(core.run_parts(events, handle_part)) == 1
    assert ran == [2]
    assert all(event.acked for event in events)


def test_an_agent_that_runs_user_steps_takes_slices_that_grow_with_the_pace_and_stop_on_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage that runs the user's steps is served bounded (its slices stop beginning events once their budget is
    spent), any other whole; both take slices that grow with the pace (they once were one event each: a
    transaction per event, twice the barrier's CPU)."""
    events = _batch(*[(0, offset) for offset in range(5)])
    runs: dict[bool, list[tuple[int, bool]]] = {}

    async def batches(stream: Any, size: int, within: float) -> Any:
        yield events

    for user_steps in (True, False):
        sizes: list[tuple[int, bool]] = []

        async def run_parts(
            piece: Any, handle_part: Any, *, concurrent: bool = False, until: float | None = None, sizes: list[Any] = sizes
        ) -> tuple[int, list[Any]]:
            sizes.append((len(piece), until is not None))
            return len(piece), []

        monkeypatch.setattr(core, "take_batches", batches)
        monkeypatch.setattr(core, "_run_parts", run_parts)

        async def handle_part(part: Any) -> None:
            return None

        async def crash(error: BaseException) -> None:
            raise AssertionError(f"the worker crashed: {error!r}")

        asyncio.run(core.handle_parts(None, handle_part, size=500, wait_ms=10, crash=crash, bounded=user_steps))  # type: ignore[arg-type]
        runs[user_steps] = sizes
    assert runs[True] == [(1, True), (2, True), (2, True)]
    assert runs[False] == [(1, False), (2, False), (2, False)]


def _each_event(handle: Any) -> Any:
    """A part handler as a flow stage has one: each event decoded and handed to ``handle``, in order."""

    async def handle_part(part: Any) -> None:
        await shell.handle_part_events(part, agent="unit", what="unit: message", handler=handle)

    return handle_part


def _fresh_gate_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit gate's events, new for this test's event loop (an asyncio event is bound to the first loop that waits)."""
    for name in ("_idle", "_open"):
        fresh = asyncio.Event()
        fresh.set()
        monkeypatch.setattr(engine.gate, name, fresh)


def test_a_bounded_slice_whose_events_turn_slow_begins_none_past_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions' events, fast at first, then 30 ms each (a service slowing down), in bounded slices of a 0.1 s
    budget grown to 40 events at the fast pace: a slice stops beginning events once 0.1 s has passed, the events it
    did not begin run in the next slices (after a commit due), each once, in offset order per partition, and a
    commit between two slices covers only events that ran, a prefix of each partition's."""
    _fresh_gate_events(monkeypatch)
    events = _batch(*[(number % 2, number) for number in range(40)])
    ran: list[int] = []
    slices: list[tuple[float, int]] = []
    committed: list[set[int]] = []

    async def handle(event: Any, body: Any) -> None:
        ran.append(event.message.offset)
        if event.message.offset >= 6:
            await asyncio.sleep(0.03)

    async def run() -> None:
        slicer = core.Slicer(500, first=40, budget_s=0.1)

        async def commit_between_slices() -> None:
            while True:
                await engine.gate.idle_event.wait()
                async with engine.gate.committing():
                    committed.append({event.message.offset for event in events if event.acked})
                await asyncio.sleep(0.001)

        committer = asyncio.ensure_future(commit_between_slices())
        rest = list(events)
        while rest:
            began = time.monotonic()
            piece, rest = rest[: slicer.size], rest[slicer.size :]
            count, left = await core._run_parts(piece, _each_event(handle), concurrent=False, until=began + slicer.budget_s)
            slicer.took(count, time.monotonic() - began)
            slices.append((time.monotonic() - began, count))
            rest = left + rest
            await asyncio.sleep(0.002)
        assert not committer.done(), committer.exception()
        committer.cancel()

    asyncio.run(run())
    assert sorted(ran) == list(range(40)), f"every event ran once: {ran}"
    for partition in (0, 1):
        mine = [offset for offset in ran if offset % 2 == partition]
        assert mine == sorted(mine), f"partition {partition} ran out of order: {mine}"
    assert slices[0][1] < 40, f"the first slice stopped on time instead of running all 40 events: {slices}"
    assert all(seconds < 0.1 + 0.03 + 0.03 for seconds, _ in slices), f"a slice ran past its budget and one event: {slices}"
    assert len(slices) > 3
    assert all(event.acked for event in events)
    assert any(0 < len(acked) < 40 for acked in committed), f"no commit came between two slices: {committed}"
    for acked in committed:
        assert acked <= set(ran), "a commit covered an event that had not run"
        for partition in (0, 1):
            mine = sorted(offset for offset in acked if offset % 2 == partition)
            assert mine == list(range(partition, 40, 2))[: len(mine)], "acked offsets are a prefix per partition"


def test_an_event_left_by_a_bounded_slice_is_not_taken_for_a_copy_when_it_comes_again() -> None:
    """The events a slice did not begin were marked delivered when it took them (a copy of one is left out): they are
    forgotten, so that the next slice processes them, and a true copy is still left out."""
    events = _batch((0, 1), (0, 2), (0, 3))
    ran: list[int] = []

    async def handle(event: Any, body: Any) -> None:
        ran.append(event.message.offset)
        await asyncio.sleep(0.02)

    async def run() -> None:
        count, left = await core._run_parts(events, _each_event(handle), concurrent=False, until=time.monotonic() + 0.005)
        assert (count, [event.message.offset for event in left]) == (1, [2, 3])
        count, left = await core._run_parts(left, _each_event(handle), concurrent=False, until=time.monotonic() + 10)
        assert (count, left) == (2, [])
        again = _Event(0, 2)
        assert await core.run_parts([again], _each_event(handle)) == 0, "a copy of a processed event is left out"

    asyncio.run(run())
    assert ran == [1, 2, 3]
