"""The barrier's behaviours on the test driver, with the flows the broker tests run (tests/integration/barrier_flows.py).

What needs the broker (a restart, a SIGKILL, two processes, a flow per process, a hundred thousand waiting on one
worker) stays in tests/integration/test_barrier.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from tests.integration.barrier_flows import make_flows
from weir import Settings, TestDriver

BARRIER = "await-kitchen-and-payment"
SETTINGS = Settings(partitions=4, retry_attempts=3, retry_backoff_ms=100)


class Shop:
    """The barrier flows on a driver, with the count of each step's runs."""

    def __init__(self, **flows: Any) -> None:
        self.runs: Counter[str] = Counter()
        self.driver = TestDriver(make_flows(record=lambda step, order_id: self.runs.update([f"{step} {order_id}"]), **flows), SETTINGS)

    def __enter__(self) -> Shop:
        return self

    def __exit__(self, *_: object) -> None:
        self.driver.close()

    def dispatch(self, order_id: str, **extra: Any) -> None:
        # The payment await reads payload 'order.id', on the waiting exchange as on payment's own; the notify flow's
        # barrier reads header 'order-id' on entry to dispatch, before any step, so it comes with it.
        body = {"order_id": order_id, "order": {"id": order_id}, "items": 2, **extra}
        self.driver.pipe("dispatch-in", body, key=order_id, headers={"trace": f"t-{order_id}", "order-id": order_id})

    def kitchen(self, order_id: str, **extra: Any) -> None:
        self.driver.pipe("kitchen", {"order_id": order_id, **extra}, key=order_id, headers={"order-id": order_id})

    def payment(self, order_id: str, **extra: Any) -> None:
        self.driver.pipe("payment", {"order": {"id": order_id}, **extra}, key=order_id)

    def dispatched(self) -> list[Any]:
        return self.driver.read("dispatched")

    def letters(self) -> dict[tuple[str, str], dict[str, Any]]:
        return {(letter["agent"], letter["reason"]): letter for letter in self.driver.dead_letters()}


def test_exchange_waits_for_both_flows_and_goes_on_as_it_arrived() -> None:
    with Shop() as shop:
        shop.dispatch("o-1")
        assert shop.dispatched() == [], "released before anything completed"
        shop.kitchen("o-1")
        assert shop.dispatched() == [], "released with payment still missing"
        shop.payment("o-1")
        [message] = shop.dispatched()
        assert message.value["order_id"] == "o-1"
        assert message.value["dispatched"] is True
        assert message.value["stamped_ms"] is not None, "the property set before the barrier is there after it"
        assert message.headers == {"trace": "t-o-1", "order-id": "o-1"}, "headers as they were on arrival at the barrier"
        assert shop.runs["stamp o-1"] == 1, "a step before the barrier never runs twice"
        assert shop.runs["dispatch o-1"] == 1


def test_completions_before_arrival_are_remembered() -> None:
    with Shop() as shop:
        shop.kitchen("o-2")
        shop.payment("o-2")
        began = shop.driver.clock.now_ms()
        shop.dispatch("o-2")
        [message] = shop.dispatched()
        assert message.value["order_id"] == "o-2"
        assert shop.driver.clock.now_ms() == began, "released at once, not at the timeout"


def test_a_retried_failure_does_not_count_and_a_definitive_one_fails_the_waiting_exchange() -> None:
    with Shop() as shop:
        for order_id in ("retried", "declined"):
            shop.dispatch(order_id)
            shop.kitchen(order_id)
        shop.payment("retried", fail_times=2)
        shop.payment("declined", fail=True)
        assert [message.value["order_id"] for message in shop.dispatched()] == ["retried"]
        letters = shop.letters()
        assert len(letters) == 2
        payment_letter = letters[("flow:payment", "failed")]
        assert payment_letter["attempts"] == 3
        assert "card declined for declined" in payment_letter["error"]
        waiting_letter = letters[("flow:dispatch", "awaited-failed")]
        assert waiting_letter["step"] == BARRIER
        assert "'payment' failed for key 'declined'" in waiting_letter["error"]
        assert shop.runs["authorize retried"] == 3, "two failures retried, then it went through"


def test_timeout_dead_letters_names_what_was_awaited_tells_awaiting_flows_and_ignores_late_completions() -> None:
    with Shop(timeout_ms=4_000) as shop:
        shop.driver.pipe("notify-in", {"order_id": "late"}, key="late", headers={"order-id": "late"})
        shop.dispatch("late")
        shop.kitchen("late")
        shop.driver.advance(seconds=3)
        assert shop.letters() == {}, "not before the timeout"
        shop.driver.advance(seconds=2)
        letters = shop.letters()
        timed_out = letters[("flow:dispatch", "timeout")]
        assert timed_out["awaiting"] == [{"flow": "payment", "key": "late"}]
        assert "timed out still awaiting 'payment' (key 'late')" in timed_out["error"]
        told = letters[("flow:notify", "awaited-failed")]
        assert "'dispatch' failed for key 'late'" in told["error"]
        shop.payment("late")
        shop.driver.advance(seconds=4)
        assert shop.dispatched() == [], "a late completion releases nothing"
        assert shop.driver.read("notified") == []


def test_a_second_waiter_on_a_key_is_dead_lettered_and_the_first_released_once() -> None:
    with Shop() as shop:  # the barrier's default rule: on_duplicate="reject"
        shop.dispatch("twice", copy=1)
        shop.dispatch("twice", copy=2)
        [letter] = shop.driver.dead_letters()
        assert (letter["reason"], letter["agent"], letter["step"]) == ("duplicate-waiter", "flow:dispatch", BARRIER)
        assert "arrived for key 'twice' while exchange" in letter["error"]
        assert orjson.loads(letter["value"]["text"])["payload"]["copy"] == 2, "the dead letter carries the second exchange"
        shop.kitchen("twice")
        shop.payment("twice")
        [message] = shop.dispatched()
        assert message.value["copy"] == 1, "the first goes on, as it arrived"
        outcomes = shop.driver.values("flow.dispatch.outcomes")
        assert sorted(outcome["outcome"] for outcome in outcomes) == ["completed", "failed"], "the refused execution ends failed"
        assert len(shop.driver.dead_letters()) == 1


def test_an_exchange_too_large_for_the_barrier_is_dead_lettered_and_fails_alone() -> None:
    """Its arrival cannot be written (1.1 MB, over what a record may hold): a dead letter, a failed outcome, no crash."""
    with Shop() as shop:
        shop.dispatch("big", inflate=1_100_000)
        shop.dispatch("small")
        for order_id in ("big", "small"):
            shop.kitchen(order_id)
            shop.payment(order_id)
        assert [message.value["order_id"] for message in shop.dispatched()] == ["small"], "the other key goes on"
        [letter] = shop.driver.dead_letters()
        assert (letter["reason"], letter["agent"], letter["step"]) == ("undeliverable", "flow:dispatch", BARRIER)
        assert "more than a record may hold" in letter["error"]
        destination = {name: raw["text"] for name, raw in letter["headers"]}["weir-destination"]
        assert destination == SETTINGS.topic(f"barrier.{BARRIER}")
        outcomes = shop.driver.values("flow.dispatch.outcomes")
        by_key = {outcome["keys"]["await-dispatch"]: outcome for outcome in outcomes}  # the key the notify barrier reads
        assert by_key["small"]["outcome"] == "completed"
        assert by_key["big"]["outcome"] == "failed"
        assert "more than a record may hold" in by_key["big"]["error"]
        assert shop.runs["stamp big"] == 1, "handled once: nothing crashed and replayed it"


def test_release_all_releases_every_waiter_on_a_key_together() -> None:
    with Shop(on_duplicate="release-all") as shop:
        shop.dispatch("both", copy=1)
        shop.dispatch("both", copy=2)
        shop.kitchen("both")
        assert shop.dispatched() == []
        shop.payment("both")
        assert sorted(message.value["copy"] for message in shop.dispatched()) == [1, 2]
        assert shop.driver.dead_letters() == []
