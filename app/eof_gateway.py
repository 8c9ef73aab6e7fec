"""The EOF gateway: sends a client's records in numbered batches, then its side data, says how many, and waits for its report.

Usage as a library::

    async with Gateway(settings.bootstrap, settings.topic) as gateway:
        report = await gateway.run_client("screen-1/2026-11-30", lines, batch_size=20)

or from the shell, one client per JSON-lines file (the file's stem is the client id)::

    python -m app.eof_gateway demo/screens/*.jsonl

A record is any JSON value (the example job, ``examples.eof_orders``, takes order lines); the side data is what
the job's ``join`` joins the client's totals with (the example's: a price list, None for its catalogue's prices).

The gateway keeps no state of its own in Kafka: a client's batches are keyed ``<client>/<batch id>``
(any filter worker may get any batch), its side data (to the joiner) and the counter messages are keyed
by client. When the report arrives it tells the controller "delivered", and the controller broadcasts the
client's cleanup to every stage that holds state for it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from weir.app.codec import dumps
from weir.app.edge import CommandParser, add_log_level, command_edge, configure_logging
from weir.app.jsonlines import read_lines
from weir.app.kafka_io import ReplyDesk, check_broker
from weir.app.settings import SettingError, load_settings
from weir.tables.eof import TOPIC_AGGREGATE, TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_JOIN, TOPIC_REPORTS, ReportDesk, topic_base

__all__ = ["Gateway", "batched", "client_messages", "delivered_message"]

#: A message of the gateway's protocol: (topic, without the deployment's prefix or the job's name; key; value).
Message = tuple[str, str, dict[str, Any]]


def batched(lines: Iterable[Any], batch_size: int) -> list[list[Any]]:
    """The client's records cut into batches of ``batch_size`` (the last one shorter)."""
    batch: list[Any] = []
    batches: list[list[Any]] = []
    for line in lines:
        batch.append(line)
        if len(batch) == batch_size:
            batches.append(batch)
            batch = []
    if batch:
        batches.append(batch)
    return batches


def client_messages(client: str, lines: Iterable[Any], *, batch_size: int, side: Any = None) -> tuple[list[Message], Message, Message]:
    """What the gateway sends for a client: its batches (keyed ``<client>/<batch id>``: any filter worker may get any
    batch), its side data for the joiner, and its end (how many batches it sent) for the controller."""
    batches = batched(lines, batch_size)
    sent = [
        (TOPIC_BATCHES, f"{client}/{batch_id}", {"client": client, "batch_id": batch_id, "lines": batch})
        for batch_id, batch in enumerate(batches)
    ]
    side_data = (TOPIC_JOIN, client, {"kind": "side", "client": client, "side": side})
    end = (TOPIC_COUNTER, client, {"kind": "sent", "client": client, "batches": len(batches)})
    return sent, side_data, end


def delivered_message(client: str) -> Message:
    """What the gateway tells the controller once it has the client's report: the cleanup may go."""
    return (TOPIC_COUNTER, client, {"kind": "delivered", "client": client})


class Gateway:
    """Runs clients through the EOF pipeline; any number at once, each waiting for its own report."""

    def __init__(
        self,
        bootstrap: str,
        topic: Callable[[str], str],
        *,
        partitions: int = 4,
        client_options: Mapping[str, Any] | None = None,
        job: str = "",
    ) -> None:
        #: the topic names of end-of-stream job ``job`` (its name in ``WEIR_EOF_JOB``; empty: the unnamed job)
        self._topic: Callable[[str], str] = lambda name: topic(topic_base(job, name))
        self._partitions = partitions
        # reports are filed by client; one that arrives before anyone waits is kept (a client run again after a restart)
        self._desk = ReplyDesk(bootstrap, self._report_of, linger_ms=5, client_options=client_options)
        #: a job answered by its filter (seed 000's task 1): its parts and end become the client's report here
        self._reports = ReportDesk()

    def _report_of(self, record: Any) -> tuple[str, Any] | None:
        """A client's report, filed by client (:class:`tables.eof.ReportDesk`)."""
        return self._reports.take(json.loads(record.value) if record.value else None)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        names = [self._topic(name) for name in (TOPIC_BATCHES, TOPIC_COUNTER, TOPIC_AGGREGATE, TOPIC_JOIN, TOPIC_REPORTS)]
        await self._desk.start(names, self._partitions, [self._topic(TOPIC_REPORTS)])

    async def stop(self) -> None:
        await self._desk.stop()

    async def send(self, client: str, lines: Iterable[Any], *, batch_size: int, side: Any = None) -> int:
        """Send the client's batches, its side data and its end; returns how many batches it sent.

        The side data goes with the end, not before the batches: the joiner drops a client it heard nothing else of
        after ten idle timeouts, and a client's batches may take longer than that."""
        producer = self._desk.producer
        batches, side_data, end = client_messages(client, lines, batch_size=batch_size, side=side)
        pending = [
            await producer.send(self._topic(topic), key=key.encode(), value=dumps(value)) for topic, key, value in [*batches, side_data]
        ]
        # The end is sent once every batch is acknowledged (the controller may still see it first: it counts by id).
        await asyncio.gather(*pending)
        topic, key, value = end
        await producer.send_and_wait(self._topic(topic), key=key.encode(), value=dumps(value))
        return len(batches)

    async def report(self, client: str, *, timeout_s: float) -> dict[str, Any]:
        """Wait for the client's report, then tell the controller it was delivered."""
        report: dict[str, Any] = await self._desk.wait(client, timeout_s)
        topic, key, value = delivered_message(client)
        await self._desk.producer.send_and_wait(self._topic(topic), key=key.encode(), value=dumps(value))
        return report

    async def run_client(
        self,
        client: str,
        lines: Iterable[Any],
        *,
        batch_size: int = 20,
        timeout_s: float = 300.0,
        side: Any = None,
    ) -> dict[str, Any]:
        """One client end to end: its batches, its side data, its end, its report (the job's join of its totals with ``side``)."""
        self._desk.expect(client)
        await self.send(client, lines, batch_size=batch_size, side=side)
        return await self.report(client, timeout_s=timeout_s)


async def _main(files: list[Path], batch_size: int, job: str) -> int:
    settings = load_settings()
    try:
        clients = {path.stem: read_lines(path) for path in files}
    except OSError as error:  # a file missing or unreadable: before anything is sent (a line not UTF-8 is one record)
        raise SettingError(str(error)) from None
    await check_broker(settings.bootstrap, client_options=settings.kafka_client_options())
    async with Gateway(settings.bootstrap, settings.topic, partitions=settings.partitions, job=job) as gateway:
        reports = await asyncio.gather(*(gateway.run_client(client, lines, batch_size=batch_size) for client, lines in clients.items()))
    for report in reports:
        print(json.dumps(report, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m app.eof_gateway", description="Run clients (one JSON-lines file each) through the EOF pipeline.")
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--job", default="", help="the job's name in WEIR_EOF_JOB (default: the unnamed job)")
    add_log_level(parser, default="warning")
    arguments = parser.parse_args(argv)
    configure_logging(arguments.log_level)
    with command_edge(parser.prog):
        return asyncio.run(_main(arguments.files, arguments.batch_size, arguments.job))


if __name__ == "__main__":
    sys.exit(main())
