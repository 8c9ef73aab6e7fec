"""The worker's garbage collector settings (app.collector): thresholds and the freeze of a started worker."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from weir.app import collector


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tuned_collector_collects_the_young_generation_less_often(restored_collector: None) -> None:
    gc.set_threshold(700, 10, 10)
    collector.tune_collector(True)
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, 10, 10)
    collector.tune_collector(False)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_started_worker_s_objects_leave_the_collector_s_walks(restored_collector: None) -> None:
    gc.unfreeze()
    alive = [[number] for number in range(1000)]  # container objects a started worker would hold
    frozen = collector.freeze_started()
    assert frozen == gc.get_freeze_count() >= len(alive)
    assert not any(gc.is_tracked(item) and item in gc.get_objects(generation=2) for item in alive[:3])


def test_frozen_objects_are_still_freed_by_reference_counting(restored_collector: None) -> None:
    import weakref

    class Held:
        pass

    held = Held()
    gone = weakref.ref(held)
    collector.freeze_started()
    del held
    assert gone() is None
