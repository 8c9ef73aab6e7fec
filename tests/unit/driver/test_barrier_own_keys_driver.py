"""A barrier whose awaits correlate by keys of their own (seed 004), on the test driver with the broker tests' flows
(tests/integration/relay_flows.py): each shipment waits under its order id for the kitchen, and for the payment under
its payment reference: one exchange, two keys, two partitions of the barrier topic, a relay between them."""

from __future__ import annotations

from collections import Counter

from tests.integration.relay_flows import FLOWS
from weir import Settings, TestDriver


def test_each_await_under_its_own_key_releases_once_and_a_completion_under_the_wrong_key_counts_for_nothing() -> None:
    """20 shipments; their kitchen and payment completions come before, after or between, each under its own key.
    Shipment 20's payment never comes; a payment whose reference happens to equal its order id does: it must
    not release it; it times out naming the payment's own key."""
    timeout_ms = 30_000  # relay_flows' default
    with TestDriver(FLOWS, Settings(partitions=4)) as driver:
        orders = [(f"o-{number}", f"p-{number}") for number in range(21)]
        early = orders[:7]  # payment and kitchen before the shipment arrives
        for order, ref in early:
            driver.pipe("cook-in", {"order_id": order}, key=order)
            driver.pipe("pay-in", {"payment_ref": ref}, key=ref)
        for order, ref in orders:
            driver.pipe("ship-in", {"order_id": order, "payment_ref": ref}, key=order)
        for order, _ in orders[7:]:
            driver.pipe("cook-in", {"order_id": order}, key=order)
        for _, ref in orders[7:20]:
            driver.pipe("pay-in", {"payment_ref": ref}, key=ref)
        driver.pipe("pay-in", {"payment_ref": "o-20"}, key="o-20")  # the wrong key for shipment o-20's payment
        counts = Counter(record["order_id"] for record in driver.values("shipped"))
        assert sorted(counts) == sorted(order for order, _ in orders[:20])
        assert set(counts.values()) == {1}, f"shipped twice: {counts.most_common(3)}"
        barrier_partitions = {record.partition for record in driver.read("barrier.gate")}
        assert len(barrier_partitions) > 1, "the keys lie on several partitions of the barrier topic: relays were needed"
        assert driver.dead_letters() == []
        driver.advance(ms=timeout_ms + 1_000)
        letters = [letter for letter in driver.dead_letters() if letter.get("step") == "gate" and letter.get("reason") == "timeout"]
        [letter] = letters
        assert letter["key"]["text"] == "o-20"
        assert letter["awaiting"] == [{"flow": "pay", "key": "p-20"}]
        assert len(driver.values("shipped")) == 20
