"""A stage served as a Faust agent runs the batch loop with the stage's own batch size, wait, slicing and concurrency."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weir.app import core, serve
from weir.app.stages import Stage


async def _nothing(part: Any) -> None:
    return None


def test_the_agent_of_a_stage_takes_its_batches_as_the_stage_says(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    async def handle_parts(stream: Any, handle_part: Any, **options: Any) -> None:
        calls.append({"handle_part": handle_part, **options})

    monkeypatch.setattr(serve, "handle_parts", handle_parts)
    topic = serve.faust_topic(core.settings.topic("unit-serve"))
    serve.serve(
        [
            Stage("unit-serve-own", (topic,), _nothing, batch_size=7, batch_wait_ms=9, concurrent_parts=True),
            Stage("unit-serve-steps", (topic,), _nothing, runs_user_steps=True),
        ]
    )
    for name in ("unit-serve-own", "unit-serve-steps"):
        asyncio.run(core.app.agents[name].fun(None))
    own, steps = calls
    assert own == {"handle_part": _nothing, "size": 7, "wait_ms": 9, "slice_most": None, "concurrent": True}
    assert steps == {"handle_part": _nothing, "size": None, "wait_ms": None, "slice_most": 1, "concurrent": False}
