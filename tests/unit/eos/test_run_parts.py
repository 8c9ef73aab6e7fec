"""How an agent handles a batch (app.core.run_parts): in offset order per partition, by one actor, at once when asked."""

from __future__ import annotations

import asyncio
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
        self.message = SimpleNamespace(tp=TP("t", partition), offset=offset, generation_id=1)
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


def test_an_agent_that_runs_user_steps_commits_after_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its slices stay at one event however fast events ran: a slice sized at the fast pace would hold hundreds of
    suddenly slow events (a service slowing down, retries) in one transaction, past its timeout."""
    events = _batch(*[(0, offset) for offset in range(5)])
    slices: dict[bool, list[int]] = {}

    async def batches(stream: Any, size: int, within: float) -> Any:
        yield events

    for user_steps in (True, False):
        sizes: list[int] = []

        async def run_parts(piece: Any, handle_part: Any, *, concurrent: bool = False, sizes: list[int] = sizes) -> int:
            sizes.append(len(piece))
            return len(piece)

        monkeypatch.setattr(core, "take_batches", batches)
        monkeypatch.setattr(core, "run_parts", run_parts)

        async def handle_part(part: Any) -> None:
            return None

        async def crash(error: BaseException) -> None:
            raise AssertionError(f"the worker crashed: {error!r}")

        slice_most = 1 if user_steps else None  # what a worker passes for a stage that runs user steps
        asyncio.run(core.handle_parts(None, handle_part, size=500, wait_ms=10, crash=crash, slice_most=slice_most))  # type: ignore[arg-type]
        slices[user_steps] = sizes
    assert slices[True] == [1, 1, 1, 1, 1]
    assert slices[False] == [1, 2, 2], "the other agents' slices grow with the pace"
