"""A plain Faust app, no weir code: the baseline of `python -m bench.compare`.

Run as ``faust -A bench.plain_faust worker`` with BENCH_APP_ID, BENCH_PASS_IN, BENCH_PASS_OUT, BENCH_COUNT_IN
and BENCH_DATA_DIR set (bench/compare.py sets them). Faust's default settings (at_least_once, JSON values),
4 partitions, RocksDB tables:

- ``passthrough``: every value read from BENCH_PASS_IN is sent to BENCH_PASS_OUT with its key;
- ``count_by_key``: counts the records of BENCH_COUNT_IN per key in a RocksDB table (one changelog
  record per update, in ``<app id>-counts-changelog``).
"""

from __future__ import annotations

import os
from typing import Any

import faust

from weir.app.settings import default_bootstrap

BOOTSTRAP = default_bootstrap()
PARTITIONS = int(os.environ.get("BENCH_PARTITIONS", "4"))

app = faust.App(
    os.environ.get("BENCH_APP_ID", "bench-plain-faust"),
    broker=f"kafka://{BOOTSTRAP}",
    store="rocksdb://",
    datadir=os.environ.get("BENCH_DATA_DIR", "/tmp/bench-plain-faust"),
    topic_partitions=PARTITIONS,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
    autodiscover=False,
)

pass_in = app.topic(os.environ.get("BENCH_PASS_IN", "bench-pass-in"), key_type=bytes, value_serializer="json", partitions=PARTITIONS)
pass_out = app.topic(os.environ.get("BENCH_PASS_OUT", "bench-pass-out"), key_type=bytes, value_serializer="json", partitions=PARTITIONS)
count_in = app.topic(os.environ.get("BENCH_COUNT_IN", "bench-count-in"), key_type=bytes, value_serializer="json", partitions=PARTITIONS)
counts = app.Table("counts", default=int, partitions=PARTITIONS, key_type=bytes, value_type=int)


@app.agent(pass_in)
async def passthrough(stream: Any) -> None:
    async for event in stream.events():
        await pass_out.send(key=event.key, value=event.value)


@app.agent(count_in)
async def count_by_key(stream: Any) -> None:
    async for event in stream.events():
        counts[event.key] += 1
