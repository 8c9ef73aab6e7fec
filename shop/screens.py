"""The shop's order screens: each reads its own JSON-lines file in order, one customer at a time.

A screen sends each line (an order, or whatever the line holds) to the shop keyed by its ticket
``<day>/<screen>/<line>``, and waits for that ticket's outcome before the next customer: ready, aborted
(with a reason) or invalid. Its day is a client of the end-of-stream pattern (shop/day.py): the screen is
the gateway. Once its N lines are out it sends its side data (none: the report prices with the catalogue) and
"sent N", waits for its report (``eof-reports``), and says "delivered", upon which every stage that keeps
state of its day drops it.

A screen is where a customer's card number is read, and the only place it is: before a line goes to Kafka its
``card`` becomes a reference (a token keyed by this run's secret, the last four digits, the Luhn fact) and any
other run of digits that looks like a card number is masked (shop/cards.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson

from shop.cards import protect_line
from shop.settings import ShopSettings
from shop.state import SHOP_TOPICS
from weir.app.codec import dumps
from weir.app.jsonlines import split_lines
from weir.app.kafka_io import ReplyDesk, read_to_end
from weir.app.settings import load_settings
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_JOIN, TOPIC_REPORTS

__all__ = ["Screens", "ScreenProgress", "Unreadable", "latencies_of", "latency_ms", "read_screen_lines", "stock_left"]


@dataclass(frozen=True)
class Unreadable:
    """A line of a screen's file that is not UTF-8 text: sent as its size, sha256 and why, answered ``invalid``."""

    reason: str
    size_bytes: int
    sha256: str


def read_screen_lines(path: Path) -> list[str | Unreadable]:
    """A screen's file: its lines, split on newlines only (JSON strings may hold U+2028 or U+0085), without a BOM; a
    line that is not UTF-8 is an :class:`Unreadable` (the shop answers it ``invalid``, the other lines go on)."""
    lines: list[str | Unreadable] = []
    for chunk in split_lines(path.read_bytes()):
        try:
            lines.append(chunk.decode("utf-8"))
        except UnicodeDecodeError as error:
            lines.append(Unreadable(f"not UTF-8 text ({error})", len(chunk), hashlib.sha256(chunk).hexdigest()))
    return lines


@dataclass
class ScreenProgress:
    """What one screen has seen so far (for the progress line)."""

    screen: str
    lines: int
    done: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    #: each answered line's latency in seconds: from just before its record is sent to its outcome read back
    latencies_s: list[float] = field(default_factory=list)

    def latency_ms(self, fraction: float) -> float | None:
        """The latency below which ``fraction`` of the answered lines fall (nearest rank), in ms; None before any."""
        return latency_ms(self.latencies_s, fraction)


def latencies_of(progress: Mapping[str, ScreenProgress]) -> list[float]:
    """Every answered line's latency in seconds, all screens' together."""
    return [latency for screen in progress.values() for latency in screen.latencies_s]


def latency_ms(latencies_s: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile of latencies in seconds, in milliseconds (None for none)."""
    if not latencies_s:
        return None
    ordered = sorted(latencies_s)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return 1000.0 * ordered[rank - 1]


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
        max_record_bytes: int | None = None,
        card_key: bytes | None = None,
    ) -> None:
        self._topic = topic
        #: the secret of this run's card tokens: given, WEIR_SHOP_CARD_KEY, or drawn for the run (never logged)
        self._card_key = card_key or ShopSettings.from_env().card_key.encode() or os.urandom(32)
        #: the largest record a screen sends (the shop's ``WEIR_MAX_MESSAGE_BYTES`` less 1 KiB, by default)
        self.max_record_bytes = max_record_bytes if max_record_bytes is not None else load_settings().max_message_bytes - 1024
        self._partitions = partitions
        self.day = day or time.strftime("%Y-%m-%dT%H%M%S")
        self._desk = ReplyDesk(bootstrap, self._reply_of, client_options=client_options)

    def _reply_of(self, record: Any) -> tuple[str, Any] | None:
        """Outcomes are filed as ``outcome:<ticket>``, reports as ``report:<screen>``."""
        if record.key is None or record.value is None:
            return None
        kind = "report" if record.topic == self._topic(TOPIC_REPORTS) else "outcome"
        return f"{kind}:{record.key.decode()}", orjson.loads(record.value)

    async def __aenter__(self) -> Screens:
        names = [self._topic(f"shop.{name}") for name in SHOP_TOPICS]
        names += [self._topic(name) for name in (TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_AGGREGATE, TOPIC_JOIN, TOPIC_REPORTS)]
        await self._desk.start(names, self._partitions, [self._topic("shop.outcomes"), self._topic(TOPIC_REPORTS)])
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self._desk.stop()

    def envelope(self, ticket: str, screen: str, line: int, text: str | Unreadable) -> bytes:
        """The record of one line; a line too large for a record, or not UTF-8, is not sent: its size and sha256 go
        instead (and why it is unreadable).

        The shop still owes that line an outcome (invalid, "too large" or "unreadable"), and the screen's report counts it.
        """
        if isinstance(text, Unreadable):
            unreadable = {"reason": text.reason, "size_bytes": text.size_bytes, "sha256": text.sha256}
            return dumps({"ticket": ticket, "screen": screen, "line": line, "text": None, "unreadable": unreadable})
        value = dumps({"ticket": ticket, "screen": screen, "line": line, "text": text})
        if len(value) <= self.max_record_bytes:
            return value
        raw = text.encode("utf-8", "surrogatepass")
        too_large = {"size_bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "limit_bytes": self.max_record_bytes}
        return dumps({"ticket": ticket, "screen": screen, "line": line, "text": None, "too_large": too_large})

    def screen_id(self, name: str) -> str:
        return f"{self.day}/{name}"

    async def run_screen(
        self, name: str, lines: Iterable[str | Unreadable], *, progress: ScreenProgress | None = None, timeout_s: float = 120.0
    ) -> dict[str, Any]:
        """Serve the file's customers in order; then announce the end of day and return the screen's report."""
        producer = self._desk.producer
        screen = self.screen_id(name)
        count = 0
        for number, text in enumerate(lines, start=1):
            count = number
            ticket = f"{screen}/{number}"
            self._desk.expect(f"outcome:{ticket}")
            value = self.envelope(ticket, screen, number, text if isinstance(text, Unreadable) else protect_line(text, self._card_key))
            sent_at = time.perf_counter()
            await producer.send_and_wait(self._topic("shop.orders"), key=ticket.encode(), value=value)
            outcome = await self._desk.wait(f"outcome:{ticket}", timeout_s)  # the next customer waits for this one
            if progress is not None:
                progress.latencies_s.append(time.perf_counter() - sent_at)
                progress.done += 1
                progress.by_status[outcome["status"]] = progress.by_status.get(outcome["status"], 0) + 1
                progress.outcomes.append(outcome)
        self._desk.expect(f"report:{screen}")
        # The side data goes at the end, with "sent N": the joiner drops a client it heard nothing else of after a
        # long while, and a day may be long (none: the report prices with the catalogue).
        side = {"kind": "side", "client": screen, "side": None}
        await producer.send_and_wait(self._topic(TOPIC_JOIN), key=screen.encode(), value=dumps(side))
        sent = {"kind": "sent", "client": screen, "batches": count}
        await producer.send_and_wait(self._topic(TOPIC_COUNTER), key=screen.encode(), value=dumps(sent))
        report: dict[str, Any] = await self._desk.wait(f"report:{screen}", timeout_s)
        delivered = {"kind": "delivered", "client": screen}
        await producer.send_and_wait(self._topic(TOPIC_COUNTER), key=screen.encode(), value=dumps(delivered))
        return report


def _last_values(records: list[Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for record in records:
        values[json.loads(record.key)] = json.loads(record.value) if record.value is not None else None
    return values


async def stock_left(
    bootstrap: str, topic: Callable[[str], str], *, client_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The stock table as its committed changelog says: flavour -> container."""
    records = await read_to_end(bootstrap, topic("shop_stock-changelog"), client_options=client_options)
    return {flavour: value for flavour, value in _last_values(records).items() if value is not None}


async def payments_by_state(
    bootstrap: str, topic: Callable[[str], str], *, client_options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The payments table as its committed changelog says: ticket -> payment."""
    records = await read_to_end(bootstrap, topic("shop_payments-changelog"), client_options=client_options)
    return {ticket: value for ticket, value in _last_values(records).items() if value is not None}
