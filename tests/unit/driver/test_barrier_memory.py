"""A barrier's memory (issue: Spring Integration consumes a trigger with the release it causes; seed 004 remembers
completions that came first): ``memory="remember"`` (default) and ``memory="consume"`` side by side on the driver."""

from __future__ import annotations

import pytest

from weir import Flow, FlowDeclarationError, Settings, TestDriver, payload

TIMEOUT_MS = 10_000


def flows(memory: str) -> list[Flow]:
    work = Flow("work", source="work").to("work-done")
    gate = (
        Flow("gate", source="gate-in")
        .barrier("wait-work", awaits=["work"], timeout_ms=TIMEOUT_MS, correlate_by=payload("id"), on_duplicate="release-all", memory=memory)  # type: ignore[arg-type]
        .to("gate-out")
    )
    return [work, gate]


def released(driver: TestDriver) -> list[int]:
    return [value["n"] for value in driver.values("gate-out")]


@pytest.mark.parametrize(("memory", "second_released_at_once"), [("remember", True), ("consume", False)])
def test_a_second_waiter_after_a_release_is_released_by_the_old_completion_only_under_remember(
    memory: str, second_released_at_once: bool
) -> None:
    with TestDriver(flows(memory), Settings(partitions=2)) as driver:
        driver.pipe("gate-in", {"id": "k", "n": 1}, key="k")
        driver.pipe("work", {"id": "k"}, key="k")
        assert released(driver) == [1]
        driver.advance(seconds=2)
        driver.pipe("gate-in", {"id": "k", "n": 2}, key="k")
        assert released(driver) == ([1, 2] if second_released_at_once else [1])
        if not second_released_at_once:
            driver.pipe("work", {"id": "k"}, key="k")  # a completion of its own releases it
            assert released(driver) == [1, 2]


def test_under_consume_a_completion_that_came_first_waits_for_one_waiter_and_is_gone_with_it() -> None:
    with TestDriver(flows("consume"), Settings(partitions=2)) as driver:
        driver.pipe("work", {"id": "j"}, key="j")
        driver.advance(seconds=1)
        driver.pipe("gate-in", {"id": "j", "n": 1}, key="j")
        assert released(driver) == [1], "a completion with no waiter is kept until one comes"
        driver.pipe("gate-in", {"id": "j", "n": 2}, key="j")
        assert released(driver) == [1], "and consumed by it"
        driver.advance(ms=TIMEOUT_MS + 1_000)
        assert [(letter["reason"], letter["agent"]) for letter in driver.dead_letters()] == [("timeout", "flow:gate")]


def test_two_waiters_released_by_one_completion_under_release_all_consume_it_together() -> None:
    with TestDriver(flows("consume"), Settings(partitions=2)) as driver:
        driver.pipe("gate-in", {"id": "k", "n": 1}, key="k")
        driver.pipe("gate-in", {"id": "k", "n": 2}, key="k")
        driver.pipe("work", {"id": "k"}, key="k")
        assert sorted(released(driver)) == [1, 2]
        driver.pipe("gate-in", {"id": "k", "n": 3}, key="k")
        assert sorted(released(driver)) == [1, 2], "the completion went with the release it caused"


def test_an_unknown_memory_is_refused_where_it_is_declared() -> None:
    with pytest.raises(FlowDeclarationError, match="memory must be one of"):
        flows("forever")
