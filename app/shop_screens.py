"""The shop's order screens: each reads its own JSON-lines file in order, one customer at a time.

A screen sends each line (an order, or whatever the line holds) to the shop keyed by its ticket
``<day>/<screen>/<line>``, and waits for that ticket's outcome before the next customer: ready, aborted
(with a reason) or invalid. At the end of its file it tells the shop how many lines it had; the shop's
report stage counts outcomes once per line (the end-of-stream counting protocol) and sends the screen's
end-of-day report when every line is accounted for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.codec import dumps
from app.kafka_io import client_options_or_env, ensure_topics, read_topic

__all__ = ["Screens", "ScreenProgress", "stock_left"]

SHOP_TOPICS = ("orders", "payments", "kitchen", "dispatch", "outcomes", "screens", "reports", "transactions")


@dataclass
class ScreenProgress:
    """What one screen has seen so far (for the progress line)."""

    screen: str
    lines: int
    done: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    outcomes: list[dict[str, Any]] = field(default_factory=list)


class Screens:
    """Runs screens against the shop's topics; any number at once, each one customer at a time."""

    def __init__(
        self,
        bootstrap: str,
        topic: Callable[[str], str],
        *,
        partitions: int = 4,
        day: str | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._bootstrap = bootstrap
        #: security options of every client (default: the environment's WEIR_KAFKA_* settings)
        self._client_options = client_options_or_env(client_options)
        self._topic = topic
        self._partitions = partitions
        self.day = day or time.strftime("%Y-%m-%dT%H%M%S")
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._arrived: dict[str, dict[str, Any]] = {}

    async def __aenter__(self) -> Screens:
        names = [self._topic(f"shop.{name}") for name in SHOP_TOPICS]
        counts = await ensure_topics(self._bootstrap, names, self._partitions, client_options=self._client_options)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._bootstrap, enable_idempotence=True, acks="all", linger_ms=0, **self._client_options
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            **self._client_options,
        )
        await self._consumer.start()
        partitions = [
            TopicPartition(name, number)
            for name in (self._topic("shop.outcomes"), self._topic("shop.reports"))
            for number in range(counts[name])
        ]
        self._consumer.assign(partitions)
        await self._consumer.seek_to_end(*partitions)
        for partition in partitions:
            await self._consumer.position(partition)
        self._reader = asyncio.create_task(self._read(), name="shop-screens-reader")
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    if record.key is None or record.value is None:
                        continue
                    kind = "report" if record.topic.endswith("shop.reports") else "outcome"
                    key = f"{kind}:{record.key.decode()}"
                    value = orjson.loads(record.value)
                    waiter = self._waiting.pop(key, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(value)
                    else:
                        self._arrived.setdefault(key, value)

    async def _wait(self, key: str, timeout_s: float) -> dict[str, Any]:
        arrived = self._arrived.pop(key, None)
        if arrived is not None:
            return arrived
        waiter = self._waiting.setdefault(key, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(waiter, timeout_s)

    def screen_id(self, name: str) -> str:
        return f"{self.day}/{name}"

    async def run_screen(
        self, name: str, lines: Iterable[str], *, progress: ScreenProgress | None = None, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Serve the file's customers in order; then announce the end of day and return the screen's report."""
        assert self._producer is not None
        screen = self.screen_id(name)
        count = 0
        for number, text in enumerate(lines, start=1):
            count = number
            ticket = f"{screen}/{number}"
            self._waiting.setdefault(f"outcome:{ticket}", asyncio.get_running_loop().create_future())
            envelope = {"ticket": ticket, "screen": screen, "line": number, "text": text}
            await self._producer.send_and_wait(self._topic("shop.orders"), key=ticket.encode(), value=dumps(envelope))
            outcome = await self._wait(f"outcome:{ticket}", timeout_s)  # the next customer waits for this one
            if progress is not None:
                progress.done += 1
                progress.by_status[outcome["status"]] = progress.by_status.get(outcome["status"], 0) + 1
                progress.outcomes.append(outcome)
        self._waiting.setdefault(f"report:{screen}", asyncio.get_running_loop().create_future())
        end = {"kind": "end", "screen": screen, "lines": count}
        await self._producer.send_and_wait(self._topic("shop.screens"), key=screen.encode(), value=dumps(end))
        return await self._wait(f"report:{screen}", timeout_s)


def _last_values(records: list[Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for record in records:
        values[json.loads(record.key)] = json.loads(record.value) if record.value is not None else None
    return values


async def stock_left(
    bootstrap: str, topic: Callable[[str], str], *, client_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The stock table as its committed changelog says: flavour -> container."""
    records = await read_topic(
        bootstrap, topic("shop_stock-changelog"), until=lambda _: False, timeout_s=2.0, client_options=client_options
    )
    return {flavour: value for flavour, value in _last_values(records).items() if value is not None}


async def payments_by_state(
    bootstrap: str, topic: Callable[[str], str], *, client_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The payments table as its committed changelog says: ticket -> payment."""
    records = await read_topic(
        bootstrap, topic("shop_payments-changelog"), until=lambda _: False, timeout_s=2.0, client_options=client_options
    )
    return {ticket: value for ticket, value in _last_values(records).items() if value is not None}
