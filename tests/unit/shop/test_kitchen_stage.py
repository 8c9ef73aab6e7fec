"""The shop's kitchen stage on weir's test driver: the worker's own stage code (shop.stages), no broker.

A reservation takes scoops and is answered; a delivery or a release settles the order's flavour and files its mark,
kept the done retention after the settle and after the order's deadline; a reservation that comes again while the
mark is kept reserves nothing, and one that comes after the mark went (past the order's deadline and the retention)
reserves nothing either and is dead-lettered ``late-reservation``.
"""

from __future__ import annotations

from typing import Any

from shop.settings import ShopSettings
from shop.stages import ShopStages
from weir import Settings, TestDriver

#: WEIR_DONE_RETENTION_MS of these tests (the default is ten minutes)
RETENTION_MS = 5_000
STOCK = 10


def driver() -> TestDriver:
    shop = ShopSettings(seed=7, stock=STOCK)
    settings = Settings(partitions=2, done_retention_ms=RETENTION_MS)
    return TestDriver(settings=settings, topologies=[lambda wiring: ShopStages(wiring, shop)])


def kitchen(kind: str, order_id: str, deadline_ms: int | None, **fields: Any) -> dict[str, Any]:
    message = {"kind": kind, "order_id": order_id, "flavour": "mint", **fields}
    if deadline_ms is not None:
        message["deadline_ms"] = deadline_ms
    return message


def mint(test: TestDriver) -> tuple[int, dict[str, int], int]:
    stock = test.table("shop_stock")["mint"]
    return stock["available"], stock["reserved"], stock["delivered"]


def test_a_reservation_delivered_again_after_its_mark_expired_reserves_nothing_and_is_dead_lettered() -> None:
    with driver() as test:
        deadline = test.clock.now_ms() + 1_000  # the order's, which the mark outlives by the retention too
        reserve = kitchen("reserve", "o-1", deadline, scoops=3)
        test.pipe("shop.kitchen", reserve, key="mint")
        test.pipe("shop.kitchen", kitchen("deliver", "o-1", deadline), key="mint")
        assert mint(test) == (STOCK - 3, {}, 3)
        assert test.table("shop_kitchen_settled") == {"mint/o-1": deadline}, "the mark counts from the deadline, later than the delivery"
        assert [answer["ok"] for answer in test.values("shop.kitchen-answers")] == [True]

        test.advance(ms=RETENTION_MS)  # the retention since the delivery, not yet since the deadline
        assert set(test.table("shop_kitchen_settled")) == {"mint/o-1"}
        test.pipe("shop.kitchen", reserve, key="mint")  # absorbed by the mark, as ever
        assert mint(test) == (STOCK - 3, {}, 3)
        test.advance(ms=1_000 + 2 * test.settings.tick_interval_ms)
        assert test.table("shop_kitchen_settled") == {}
        assert test.dead_letters() == []

        test.advance(ms=60_000)
        test.pipe("shop.kitchen", reserve, key="mint")
        assert mint(test) == (STOCK - 3, {}, 3), "no scoops held for a delivered order"
        assert len(test.values("shop.kitchen-answers")) == 1, "the late reservation is not answered"
        [letter] = test.dead_letters()
        assert (letter["reason"], letter["agent"]) == ("late-reservation", "shop_kitchen")
        assert "nothing is reserved or answered" in letter["error"]
        assert test.table("shop_kitchen_settled") == {}, "and it files no mark"


def test_a_released_order_s_reservation_after_the_retention_holds_nothing_and_a_held_one_is_answered_again() -> None:
    with driver() as test:
        deadline = test.clock.now_ms() + 1_000
        test.pipe("shop.kitchen", kitchen("reserve", "o-1", deadline, scoops=2), key="mint")
        test.pipe("shop.kitchen", kitchen("reserve", "o-2", deadline, scoops=4), key="mint")
        test.pipe("shop.kitchen", kitchen("release", "o-1", deadline), key="mint")
        assert mint(test) == (STOCK - 4, {"o-2": 4}, 0)
        test.advance(ms=1_000 + RETENTION_MS + 2 * test.settings.tick_interval_ms)
        assert test.table("shop_kitchen_settled") == {}

        test.pipe("shop.kitchen", kitchen("reserve", "o-1", deadline, scoops=2), key="mint")
        test.pipe("shop.kitchen", kitchen("reserve", "o-2", deadline, scoops=4), key="mint")  # still held: answered again
        assert mint(test) == (STOCK - 4, {"o-2": 4}, 0)
        assert [(answer["order_id"], answer["ok"]) for answer in test.values("shop.kitchen-answers")] == [
            ("o-1", True),
            ("o-2", True),
            ("o-2", True),
        ]
        assert [letter["reason"] for letter in test.dead_letters()] == ["late-reservation"]
        test.pipe("shop.kitchen", kitchen("deliver", "o-2", deadline), key="mint")
        assert mint(test) == (STOCK - 4, {}, 4)


def test_a_reservation_in_time_or_without_a_deadline_is_taken_and_a_bad_deadline_is_refused() -> None:
    with driver() as test:
        deadline = test.clock.now_ms()
        test.advance(ms=RETENTION_MS - 1_000)  # after its deadline, within the retention: the dispatch may still wait
        test.pipe("shop.kitchen", kitchen("reserve", "o-1", deadline, scoops=1), key="mint")
        test.advance(ms=10 * RETENTION_MS)
        test.pipe("shop.kitchen", kitchen("reserve", "o-2", None, scoops=2), key="mint")  # written before deadlines travelled
        assert mint(test) == (STOCK - 3, {"o-1": 1, "o-2": 2}, 0)
        test.pipe("shop.kitchen", kitchen("release", "o-2", None), key="mint")
        assert test.table("shop_kitchen_settled") == {"mint/o-2": test.clock.now_ms()}, "a mark without a deadline: from the release"
        assert test.dead_letters() == []

        test.pipe("shop.kitchen", kitchen("reserve", "o-3", deadline, scoops=1) | {"deadline_ms": "soon"}, key="mint")
        [letter] = test.dead_letters()
        assert "'deadline_ms' must be an integer" in letter["error"]
        assert mint(test) == (STOCK - 1, {"o-1": 1}, 0)
