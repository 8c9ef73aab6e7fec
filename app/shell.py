"""What every stage shares, with no worker behind it: decoding, dead letters, the owed outcome, the time.

A stage's code (:mod:`app.aggregation`, :mod:`app.flow_topology`, :mod:`app.eof_topology`, :mod:`app.pipeline`, the
keyed-state runtime) uses these; they read the environment (:mod:`app.runtime.environment`) for the clock, the outlet
and the limits, so that the same code runs in a worker (``app.core`` installs its environment) and in the test driver.
Importing this module builds no Faust application and reads no setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from faust.types import EventT

from weir.app import metrics
from weir.app.codec import DecodeError, dumps, loads
from weir.app.errors import OutputFailed, Redaction, dead_letter_record, describe_error, fitted_dead_letter, redacted_dead_letter
from weir.app.runtime import environment
from weir.app.split import InvalidMessage

__all__ = [
    "now_ms",
    "message_headers",
    "decode_event",
    "EventHandler",
    "OwedOutcome",
    "handle_part_events",
    "SliceClock",
    "slice_clock",
    "dead_lettered",
    "all_at_once",
    "record_limit",
    "partitions_of",
    "dead_letter_key",
    "redact_dead_letters",
    "send_dead_letter_record",
    "dead_letter_value",
    "send_dead_letter",
    "InvalidMessage",
    "DecodeError",
]

log = logging.getLogger(__name__)


def now_ms() -> int:
    """The time now, by the environment's clock (:mod:`app.runtime.environment`: the wall clock in a worker)."""
    return environment.current().clock.now_ms()


def message_headers(event: EventT[bytes]) -> list[tuple[str, bytes]]:
    raw = event.message.headers or []
    items: Iterable[Any] = raw.items() if isinstance(raw, dict) else raw
    return [(str(name), bytes(value) if value is not None else b"") for name, value in items]


def decode_event(event: EventT[bytes], *, what: str) -> Any:
    """The event's JSON value, or :class:`DecodeError` naming ``what`` was read."""
    return loads(event.message.value, what=what, max_bytes=environment.current().max_message_bytes)


EventHandler = Callable[[EventT[bytes], Any], Awaitable[None]]

#: What an agent that owes an outcome per input sends when the input failed: (event, reason, error) -> None.
#: Called after the input's dead letter, whatever failed (decoding, validation, a bug); it must not raise.
OwedOutcome = Callable[[EventT[bytes], str, str], Awaitable[None]]


class SliceClock:
    """The time of a slice of a stage that runs the user's steps (:func:`app.core.run_sliced` with ``bounded``).

    Such a slice is sized at the pace of its last one, like any other, but the user's steps can turn slow at any
    event (a service slowing down, retries): once ``deadline`` has passed, no further event of the slice begins
    (:func:`handle_part_events` stops between two events; a part not begun is left whole), and the events left
    go in the next slice, after a commit that is due. A transaction then holds at most the budget and one event's
    time, as when every event was a slice of its own. ``handled``: how many events of the current part ran.
    """

    __slots__ = ("begun", "deadline", "handled")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.begun = 0
        self.handled: int | None = None

    def up(self) -> bool:
        """Whether the slice's time is up: past its deadline, with at least one event run (a slice runs one at least)."""
        return self.begun > 0 and time.monotonic() > self.deadline


#: The clock of the slice whose part is being handled, when that slice is bounded (None: the part runs whole).
slice_clock: contextvars.ContextVar[SliceClock | None] = contextvars.ContextVar("weir_slice_clock", default=None)


async def handle_part_events(
    part: Sequence[EventT[bytes]],
    *,
    agent: str,
    what: str,
    handler: EventHandler,
    concurrent: bool = False,
    owed: OwedOutcome | None = None,
) -> None:
    """Handle a partition's part of a batch (:func:`_handle_one` on each event): in order, or all at once.

    In order, in a bounded slice (:class:`SliceClock`), no event begins once the slice's time is up: how many ran is
    left in the clock, and the rest of the part goes in the next slice."""
    clock = slice_clock.get()
    if concurrent:
        await all_at_once(_handle_one(event, agent=agent, what=what, handler=handler, owed=owed) for event in part)
        handled = len(part)
    elif clock is None:
        for event in part:
            await _handle_one(event, agent=agent, what=what, handler=handler, owed=owed)
        handled = len(part)
    else:
        token = slice_clock.set(None)  # the clock is this part's: a handler's own parts run whole
        handled = 0
        try:
            for event in part:
                if clock.up():
                    break
                clock.begun += 1
                await _handle_one(event, agent=agent, what=what, handler=handler, owed=owed)
                handled += 1
        finally:
            slice_clock.reset(token)
            clock.handled = handled
    metrics.events_handled(agent, handled)


async def _handle_one(event: EventT[bytes], *, agent: str, what: str, handler: EventHandler, owed: OwedOutcome | None = None) -> None:
    await dead_lettered(event, agent=agent, run=lambda: handler(event, decode_event(event, what=what)), owed=owed)


async def dead_lettered(event: EventT[bytes], *, agent: str, run: Callable[[], Awaitable[None]], owed: OwedOutcome | None = None) -> None:
    """Run ``run()`` (the handling of ``event``, or of a part of it: :func:`dead_letter_value`); dead-letter what it raises.

    Undecodable and invalid input, and any other error (a bug, logged with its traceback), go to the dead
    letters with the step that failed; cancellation goes on. ``owed(event, reason, error)`` then sends the
    outcome the input is owed (an agent that answers every input). An output the producer refused
    (:class:`app.errors.OutputFailed`) is not the input's fault: it goes up, and the batch fails.
    """
    try:
        await run()
        return
    except OutputFailed:
        # Not the input's fault, and not to be skipped: no dead letter, no owed outcome. The batch fails, the
        # transaction that holds its outputs cannot commit them, and the input is handled again.
        log.error("%s: an output of %s@%s could not be sent; the batch fails", agent, event.message.tp, event.message.offset)
        raise
    except DecodeError as error:
        reason, text, step = "undecodable", str(error), "decode"
    except InvalidMessage as error:
        reason, text, step = "invalid", str(error), "validate"
    except asyncio.CancelledError:
        raise
    except Exception as error:
        log.exception("%s: unexpected error while handling %s", agent, event.message.tp)
        reason, text, step = "error", describe_error(error), "handle"
    await send_dead_letter(event, reason=reason, error=text, agent=agent, step=step)
    if owed is not None:
        await owed(event, reason, text)


async def all_at_once(coroutines: Iterable[Awaitable[None]]) -> None:
    """Run ``coroutines`` concurrently; when one raises, cancel the others, wait for them, and raise its error."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def record_limit() -> int:
    """The largest value weir sends in one record: what it decodes (``WEIR_MAX_MESSAGE_BYTES``) and its producer sends,
    less 1 KiB (the environment's: a worker's, or the test driver's)."""
    return environment.current().record_limit


def partitions_of(topic: str) -> int | None:
    """How many partitions ``topic`` has (as the broker described it when this worker started, or the driver's); None: unknown."""
    return environment.current().outlet.partitions(topic)


#: A dead letter's record key longer than this is replaced by its hash (the record's value keeps it, cut).
DEAD_LETTER_KEY_BYTES = 1024


def dead_letter_key(key: bytes | None) -> bytes | None:
    """The record key of a dead letter: the original key, or ``sha256:<hex>`` of it when it is too long to carry."""
    if key is None or len(key) <= DEAD_LETTER_KEY_BYTES:
        return key
    return b"sha256:" + hashlib.sha256(key).hexdigest().encode()


#: Per agent, what its dead letters go through before they are stored (:func:`redact_dead_letters`).
_redactions: dict[str, Redaction] = {}


def redact_dead_letters(agent: str, redact: Redaction) -> None:
    """Every dead letter of ``agent`` stores the original key, value, header values and error only through ``redact``.

    The one dead-letter path applies it (:func:`send_dead_letter`, :func:`send_dead_letter_record`), whatever failed:
    undecodable input, invalid input, a bug, a refused or undeliverable output. The shop's orders stage masks card
    numbers with it. ``redact`` must be pure and quick; it sees bytes that may not be UTF-8.
    """
    _redactions[agent] = redact


async def send_dead_letter_record(record: dict[str, Any]) -> None:
    """Publish a dead-letter record built with :func:`app.errors.dead_letter_record`, cut to fit a record (never dropped)."""
    key = record["key"]["text"]
    await _publish_dead_letter(record, key.encode() if key is not None else None)


async def _publish_dead_letter(record: dict[str, Any], raw_key: bytes | None) -> None:
    """The one way out for a dead letter: through the agent's redaction, logged (no payload), counted, cut to fit."""
    redact = _redactions.get(record["agent"])
    if redact is not None:
        record = redacted_dead_letter(record, redact)
        raw_key = None if raw_key is None else redact(raw_key)
    # Payloads stay out of INFO logs: the dead-letter topic has them.
    log.warning("dead letter from %s/%s (%s): %s", record["agent"], record["step"], record["reason"], str(record["error"])[:200])
    metrics.dead_lettered(record["agent"], record["reason"])
    outlet = environment.current().outlet
    await outlet.send(outlet.dead_letters, dead_letter_key(raw_key), fitted_dead_letter(record, record_limit()), None, None)


#: The part of the event's message being handled (one message of a bundle), which a dead letter holds instead of the whole.
_handled_part: contextvars.ContextVar[Any] = contextvars.ContextVar("weir_handled_part", default=None)


@contextlib.contextmanager
def dead_letter_value(part: Any) -> Iterator[None]:
    """Inside it, a dead letter of the current event holds ``part`` (JSON-encoded), not the event's whole value."""
    token = _handled_part.set(part)
    try:
        yield
    finally:
        _handled_part.reset(token)


async def send_dead_letter(
    event: EventT[bytes],
    *,
    reason: str,
    error: str,
    agent: str,
    step: str,
    attempts: int = 1,
    value: bytes | None = None,
    key: bytes | None = None,
) -> None:
    """Publish the event's original message to the dead-letter topic, saying where and why it stopped.

    ``value``: what failed when it is a part of the message (one item of a chunk), instead of the whole value;
    by default the part :func:`dead_letter_value` names, if any. ``key``: the key the dead letter is about, when it
    is not the message's (keyed state dropped on a tick).
    """
    message = event.message
    key = message.key if key is None else key
    if value is None and (part := _handled_part.get()) is not None:
        value = dumps(part)
    record = dead_letter_record(
        reason=reason,
        error=error,
        agent=agent,
        step=step,
        attempts=attempts,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=key,
        value=message.value if value is None else value,
        headers=message_headers(event),
    )
    await _publish_dead_letter(record, key)
