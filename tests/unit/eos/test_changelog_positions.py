"""How far each changelog partition is in its store, recorded when the transaction that wrote it commits
(:func:`app.engine.commit.persist_changelog_positions`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP

from weir.app.engine.commit import persist_changelog_positions

A, B = TP("t-changelog", 0), TP("t-changelog", 1)


class Store:
    def __init__(self) -> None:
        self.positions: dict[TP, int] = {}

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self.positions[tp] = offset


def test_the_committed_writes_positions_are_recorded_and_later_ones_wait_for_their_commit() -> None:
    store = Store()
    tables: Any = SimpleNamespace(_pending_persisted_offsets={A: (store, 41), B: (store, 7)})
    written = dict(tables._pending_persisted_offsets)  # the transaction's writes, delivered
    tables._pending_persisted_offsets[B] = (store, 9)  # a write after them (the next transaction's)
    persist_changelog_positions(tables, written)
    assert store.positions == {A: 41, B: 7}
    assert tables._pending_persisted_offsets == {B: (store, 9)}, "the later write is recorded at its own commit"
