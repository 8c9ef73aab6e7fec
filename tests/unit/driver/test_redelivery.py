"""A step run again after a failure can tell (Camel's CamelRedelivered / CamelRedeliveryCounter): the exchange's
``attempt`` and ``redelivered``, and ``weir.attempt()`` for the pipeline's item step (in its thread too)."""

from __future__ import annotations

from typing import Any

from weir import Exchange, Flow, Settings, TestDriver, attempt, payload

SETTINGS = Settings(partitions=1, retry_attempts=3, retry_backoff_ms=10, retry_max_backoff_ms=10)


def test_a_flow_step_sees_its_attempt_and_a_later_step_starts_at_one() -> None:
    seen: list[tuple[str, int, bool]] = []

    def flaky(exchange: Exchange) -> Any:
        seen.append(("flaky", exchange.attempt, exchange.redelivered))
        if exchange.attempt < 3:
            raise ConnectionError("service unavailable")
        return exchange.payload

    def after(exchange: Exchange) -> Any:
        seen.append(("after", exchange.attempt, exchange.redelivered))
        return exchange.payload

    flow = Flow("f", source="in").process("flaky", flaky).process("after", after).to("out")
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("in", {"n": 1}, key="k")
        assert driver.values("out") == [{"n": 1}]
    assert seen == [("flaky", 1, False), ("flaky", 2, True), ("flaky", 3, True), ("after", 1, False)]


def test_a_split_items_step_sees_its_attempt() -> None:
    seen: dict[int, list[int]] = {}

    def flaky(exchange: Exchange) -> Any:
        seen.setdefault(exchange.payload, []).append(exchange.attempt)
        if exchange.payload == 2 and not exchange.redelivered:
            raise TimeoutError("slow")
        return exchange.payload

    flow = Flow("g", source="in").split("items", payload("items")).process("call", flaky).aggregate("all", timeout_ms=None).to("out")
    with TestDriver([flow], SETTINGS) as driver:
        driver.pipe("in", {"items": [1, 2]}, key="k")
        assert [item["status"] for item in driver.values("out")[0]["items"]] == ["ok", "ok"]
    assert seen == {1: [1], 2: [1, 2]}


def test_the_pipelines_item_step_reads_its_attempt_in_its_thread() -> None:
    seen: list[int] = []

    def step(item: Any) -> Any:
        seen.append(attempt())
        if attempt() == 1:
            raise ConnectionError("first try fails")
        return item

    with TestDriver(settings=SETTINGS, item_step=step) as driver:
        driver.pipe("orders", {"order_id": "o-1", "items": [{"sku": "a"}]}, key="o-1")
        [result] = driver.values("aggregates")
    assert result["status"] == "complete"
    assert seen == [1, 2]
    assert attempt() == 1, "outside a step: the first attempt"


def test_a_sync_item_step_in_a_thread_pool_reads_its_attempt_there() -> None:
    import asyncio
    import threading

    from weir.app.pipeline import make_step

    seen: list[tuple[int, bool]] = []

    def step(item: Any) -> Any:
        seen.append((attempt(), threading.current_thread() is not threading.main_thread()))
        if attempt() < 2:
            raise ConnectionError("first try fails")
        return item

    run, _ = make_step(step, threads=2, policy=SETTINGS.retry_policy())
    outcome = asyncio.run(run({"sku": "a"}, 0, {}))
    assert (outcome.ok, outcome.attempts) == (True, 2)
    assert seen == [(1, True), (2, True)]
