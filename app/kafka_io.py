"""Plain aiokafka helpers for what stands outside the workers: feeding input, reading outputs (demo, tests, bench)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from app.codec import dumps
from app.settings import kafka_client_options

__all__ = ["produce", "produce_json", "read_topic", "ensure_topics", "client_options_or_env"]


def client_options_or_env(client_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``client_options`` as given, or the security options of the environment (``WEIR_KAFKA_SECURITY_PROTOCOL`` ...).

    Every helper takes an explicit bootstrap; its client options default to the environment's so that a
    SASL or TLS deployment needs no change in the callers.
    """
    return dict(client_options) if client_options is not None else kafka_client_options()


async def ensure_topics(
    bootstrap: str, names: Iterable[str], partitions: int, *, timeout_s: float = 30.0, client_options: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """Create the topics that do not exist yet, wait until the broker lists them; their partition counts.

    A consumer that subscribes before its topics are in the broker's metadata is assigned nothing and
    only notices them minutes later (a just-started broker is slow to show new topics).
    """
    wanted = list(names)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options_or_env(client_options))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, partitions, 1) for name in wanted if name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except Exception as error:  # created meanwhile by a worker: fine
                if "TopicAlreadyExists" not in type(error).__name__ + str(error):
                    raise
        deadline = time.monotonic() + timeout_s
        while True:
            described = await admin.describe_topics(wanted)
            ready = {entry["topic"] for entry in described if entry.get("error_code", 0) == 0 and entry.get("partitions")}
            if ready >= set(wanted):
                return {entry["topic"]: len(entry["partitions"]) for entry in described if entry["topic"] in ready}
            if time.monotonic() > deadline:
                message = f"topics {sorted(set(wanted) - ready)} not visible on {bootstrap} after {timeout_s}s"
                raise TimeoutError(message)
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    partition: int | None = None,
    client_options: Mapping[str, Any] | None = None,
) -> int:
    """Send raw (key, value) records, waiting until the broker has all of them; returns how many."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, linger_ms=5, **client_options_or_env(client_options))
    try:
        await producer.start()
    except BaseException:  # refused (credentials) or unreachable: close what start opened
        await producer.stop()
        raise
    count = 0
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, value=value, key=key, partition=partition))
            count += 1
        await producer.flush()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return count


async def produce_json(
    bootstrap: str, topic: str, records: Iterable[tuple[str, Any]], *, client_options: Mapping[str, Any] | None = None
) -> int:
    return await produce(bootstrap, topic, ((key.encode(), dumps(value)) for key, value in records), client_options=client_options)


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    until: Callable[[list[Any]], bool],
    timeout_s: float,
    decode: Callable[[bytes], Any] | None = None,
    read_committed: bool = True,
    client_options: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Read ``topic`` from the beginning (read_committed) until ``until(records)`` holds or the timeout passes."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
        group_id=None,
        **client_options_or_env(client_options),
    )
    await consumer.start()
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while not until(records) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                for message in messages:
                    records.append(decode(message.value) if decode and message.value is not None else message)
    finally:
        await consumer.stop()
    return records
