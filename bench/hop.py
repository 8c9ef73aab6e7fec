"""The floor of one hop at a light load: `python -m bench.hop [--mode eos|alos] [--records N] [--rate R]`.

No weir here: aiokafka alone, one record per transaction, committed at once. A producer sends N records at R/s
to topic A; the hop reads A (read_committed) and, for each record, in one transaction, sends it to topic B
(AddPartitionsToTxn and Produce), adds its offset (AddOffsetsToTxn and TxnOffsetCommit) and commits (EndTxn). A
read_committed reader of B times each record from its send to A to its arrival. ``--mode alos``: the same hop
without a transaction (an idempotent acks=all send, awaited, then the consumer's offset commit), to set what the
transaction's requests cost beside a produce and a fetch.

What it is for: a pipeline's hop at a light load cannot be faster than this on the same broker and machine; what a
hop of weir (or any client's loop that batches) takes above it is its own waiting and work.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from weir.app.kafka_io import delete_topics, ensure_topics
from weir.app.settings import default_bootstrap

STEPS = ("send", "offsets", "commit", "end to end")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def hop_run(bootstrap: str, mode: str, records: int, rate: float) -> dict[str, list[float]]:
    """Each step's times in ms: the hop's send, its offsets, its commit, and each record's way from A's producer to B's reader."""
    run = uuid.uuid4().hex[:8]
    source, sink, group = f"hop-a-{run}", f"hop-b-{run}", f"hop-{run}"
    await ensure_topics(bootstrap, [source, sink], 1)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    hop_in = AIOKafkaConsumer(
        source, bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed", enable_auto_commit=False,
        auto_offset_reset="earliest",
    )  # fmt: skip
    transactional = {"transactional_id": f"hop-{run}"} if mode == "eos" else {"acks": "all", "enable_idempotence": True}
    hop_out = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, **transactional)
    reader = AIOKafkaConsumer(sink, bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest")
    await asyncio.gather(producer.start(), hop_in.start(), hop_out.start(), reader.start())
    sent_at: dict[bytes, float] = {}
    times: dict[str, list[float]] = {step: [] for step in STEPS}

    async def hop() -> None:
        while True:
            for tp, batch in (await hop_in.getmany(timeout_ms=100, max_records=1)).items():
                for record in batch:
                    began = time.monotonic()
                    if mode == "eos":
                        await hop_out.begin_transaction()
                    await (await hop_out.send(sink, record.value))
                    sent = time.monotonic()
                    if mode == "eos":
                        await hop_out.send_offsets_to_transaction({tp: record.offset + 1}, group)
                        added = time.monotonic()
                        await hop_out.commit_transaction()
                    else:
                        await hop_in.commit({tp: record.offset + 1})
                        added = time.monotonic()
                    times["send"].append(1000 * (sent - began))
                    times["offsets"].append(1000 * (added - sent))
                    times["commit"].append(1000 * (time.monotonic() - added))

    async def read() -> None:
        while len(times["end to end"]) < records:
            for batch in (await reader.getmany(timeout_ms=200)).values():
                times["end to end"].extend(1000 * (time.monotonic() - sent_at[record.value]) for record in batch)

    hopping, reading = asyncio.create_task(hop()), asyncio.create_task(read())
    try:
        await asyncio.sleep(2)  # every client has joined and is fetching
        for number in range(records):
            value = f"{run}-{number}".encode()
            sent_at[value] = time.monotonic()
            await producer.send(source, value)
            await asyncio.sleep(1 / rate)
        await asyncio.wait_for(reading, 60)
    finally:
        hopping.cancel()
        await asyncio.gather(hopping, producer.stop(), hop_in.stop(), hop_out.stop(), reader.stop(), return_exceptions=True)
        await delete_topics(bootstrap, run)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("eos", "alos"), default="eos")
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    times = asyncio.run(hop_run(default_bootstrap(), args.mode, args.records, args.rate))
    print(f"one hop, mode {args.mode}, {args.records} records at {args.rate:g}/s (ms):")
    for step in STEPS:
        values = times[step]
        p50, p99, mean = percentile(values, 0.5), percentile(values, 0.99), statistics.fmean(values)
        print(f"  {step:>10}: p50 {p50:5.1f}  p99 {p99:5.1f}  mean {mean:5.1f}")


if __name__ == "__main__":
    main()
