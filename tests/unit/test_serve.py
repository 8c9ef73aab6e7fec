"""A stage served as a Faust agent runs the batch loop with the stage's own batch size, wait, slicing and concurrency
(defaults: the application's settings), and stops the worker through the application's Faust app."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from weir import Application, Settings
from weir.app import application as application_module
from weir.app.runtime import environment
from weir.app.stages import Stage


async def _nothing(part: Any) -> None:
    return None


def test_the_agent_of_a_stage_takes_its_batches_as_the_stage_says(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    async def handle_parts(stream: Any, handle_part: Any, **options: Any) -> None:
        calls.append({"handle_part": handle_part, **options})

    monkeypatch.setattr(application_module, "handle_parts", handle_parts)
    application = Application(Settings(app_id="unit-serve", batch_size=300, batch_wait_ms=40))
    try:
        topic = application.topic(application.settings.topic("unit-serve"))
        application.serve(
            [
                Stage("unit-serve-own", (topic,), _nothing, batch_size=7, batch_wait_ms=9, concurrent_parts=True),
                Stage("unit-serve-steps", (topic,), _nothing, runs_user_steps=True),
            ]
        )
        for name in ("unit-serve-own", "unit-serve-steps"):
            asyncio.run(application.app.agents[name].fun(None))
    finally:
        environment.install(environment.STANDALONE)
    own, steps = calls
    crash = application.app.crash
    assert own == {"handle_part": _nothing, "size": 7, "wait_ms": 9, "bounded": False, "concurrent": True, "crash": crash}
    assert steps == {"handle_part": _nothing, "size": 300, "wait_ms": 40, "bounded": True, "concurrent": False, "crash": crash}
    assert topic in application.topics.all(), "a declared topic is created when the worker starts"
