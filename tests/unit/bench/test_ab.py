"""bench.ab: which figures of a bench.compare run it compares."""

from __future__ import annotations

from bench.ab import _pick


def test_only_the_backlog_throughput_and_cpu_per_order_of_each_system_are_compared() -> None:
    figures = [
        {"system": "weir, items inline", "name": "backlog of 20,000 orders: orders/s", "values": [4977.3]},
        {"system": "weir, items inline", "name": "backlog of 20,000 orders: items/s", "values": [49773.0]},
        {"system": "weir, items inline", "name": "backlog of 20,000 orders: CPU per order, the workers", "values": [0.1635]},
        {"system": "weir, items inline", "name": "backlog of 20,000 orders: CPU per order, the broker", "values": [0.05]},
        {"system": "weir, items inline", "name": "offered 20 orders/s for 10 s: latency p99", "values": [17.0]},
        {"system": "Quix Streams, inline", "name": "backlog of 20,000 orders: orders/s", "values": [3583.3]},
        {"system": "Quix Streams, inline", "name": "backlog of 20,000 orders: CPU per order, the workers", "values": []},
    ]
    assert _pick(figures) == {  # type: ignore[arg-type]
        ("weir, items inline", "orders/s"): 4977.3,
        ("weir, items inline", "CPU per order, the workers"): 0.1635,
        ("Quix Streams, inline", "orders/s"): 3583.3,
    }
