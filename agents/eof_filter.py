"""EOF filter stage: runs the job's ``select`` on each record, forwards, splits or drops each batch, and reports what it forwarded."""

from __future__ import annotations

from typing import Any

from faust.types import EventT, StreamT

from agents.eof_common import JOB, aggregate_topic, batches_topic, counter_topic
from app.core import InvalidMessage, app, handle_events, settings
from app.runtime.keyed import Output, send_checked
from tables.eof import filter_batch

__all__ = ["eof_filter"]

AGENT = "eof_filter"


def _parse_batch(message: Any) -> tuple[str, int, list[Any]]:
    if not isinstance(message, dict):
        raise InvalidMessage(f"eof filter: a batch must be a JSON object, got {type(message).__name__}")
    client, batch_id, lines = message.get("client"), message.get("batch_id"), message.get("lines")
    if not isinstance(client, str) or not client:
        raise InvalidMessage(f"eof filter: 'client' must be a non-empty string, got {client!r:.60}")
    if not isinstance(batch_id, int) or isinstance(batch_id, bool) or batch_id < 0:
        raise InvalidMessage(f"eof filter: batch of client {client!r} needs a non-negative integer 'batch_id', got {batch_id!r:.60}")
    if not isinstance(lines, list):
        raise InvalidMessage(f"eof filter: batch {batch_id} of client {client!r} needs 'lines', a list (of the client's records)")
    return client, batch_id, lines


async def _filter(event: EventT[bytes], message: Any) -> None:
    client, batch_id, lines = _parse_batch(message)
    outcome = filter_batch(batch_id, lines, JOB, settings.eof_max_batch_orders)
    batches = [
        Output(aggregate_topic, client, {"kind": "batch", "client": client, "batch_id": out_id, "records": records})
        for out_id, records in outcome.forwarded
    ]
    # A forwarded batch too large for a record is dead-lettered here and not counted as forwarded: the
    # aggregator waits only for batches that exist.
    dead = await send_checked(event, batches, agent=AGENT, step="forward")
    forwarded = len(batches) - len(dead)
    await _report(event, client, batch_id, forwarded=forwarded, dropped=len(outcome.dropped) + len(dead))


async def _report(event: EventT[bytes], client: str, batch_id: int, *, forwarded: int, dropped: int) -> None:
    """The batch's report to the controller, in the same transaction as the forwarded batches and the batch's offset."""
    report = {"kind": "filtered", "client": client, "batch_id": batch_id, "forwarded": forwarded, "dropped": dropped}
    await send_checked(event, [Output(counter_topic, client, report)], agent=AGENT, step="report")


async def _owed(event: EventT[bytes], reason: str, error: str) -> None:
    """A batch that could not be filtered at all still gets its report (nothing forwarded), by its key ``client/batch``."""
    key = event.message.key.decode("utf-8", "replace") if event.message.key else ""
    client, _, batch = key.rpartition("/")
    if client and batch.isdigit():
        await _report(event, client, int(batch), forwarded=0, dropped=0)


@app.agent(batches_topic)
async def eof_filter(stream: StreamT[bytes]) -> None:
    """Reads a client's batches (keyed client/batch, so any filter worker may get any batch of a client)."""
    await handle_events(stream, agent=AGENT, what="eof filter: batch", handler=_filter, owed=_owed)
