"""Faust's RocksDB store internals the web views read: a table's keys by partition, decoded, without the table's API.

Faust's ``rocksdb://`` store keeps one database per partition (``_dbs``) and hides the keys other workers'
partitions left in a local database (``_visible_items``); a table's own ``items()`` reads every partition it
has, with no partition number. Any other store (``memory://``) has neither: a view then reads the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from faust.types import TableT

__all__ = ["by_partition", "partition_items", "partition_get"]


def by_partition(table: TableT[Any, Any]) -> bool:
    """Whether ``table``'s store keeps one RocksDB database per partition (Faust's ``rocksdb://`` store)."""
    store: Any = table.data
    return getattr(store, "_dbs", None) is not None and hasattr(store, "_visible_items")


def partition_items(table: TableT[Any, Any], partition: int) -> Iterator[tuple[Any, Any]]:
    """The decoded (key, value) pairs of one partition's database (none when it is not open here); see :func:`by_partition`."""
    store: Any = table.data
    db = store._dbs.get(partition)
    if db is None:
        return
    for raw_key, raw_value in store._visible_items(db):
        yield store._decode_key(raw_key), store._decode_value(raw_value)


def partition_get(table: TableT[Any, Any], key: Any, partitions: Iterable[int]) -> tuple[int, Any] | None:
    """The first of ``partitions`` whose database holds ``key``, with its decoded value (None: none does)."""
    store: Any = table.data
    raw_key = store._encode_key(key)
    for partition in partitions:
        db = store._dbs.get(partition)
        raw_value = db.get(raw_key) if db is not None else None
        if raw_value is not None:
            return partition, store._decode_value(raw_value)
    return None
