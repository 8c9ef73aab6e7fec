"""Shared error handling: a retry policy for failing steps and dead-letter records for what cannot go on."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from weir.app.codec import dumps as _dumps
from weir.app.runtime import environment

__all__ = [
    "OutputFailed",
    "RetryPolicy",
    "StepOutcome",
    "run_with_retry",
    "attempt",
    "dead_letter_record",
    "fitted_dead_letter",
    "Redaction",
    "redacted_dead_letter",
    "describe_error",
]

T = TypeVar("T")


class OutputFailed(Exception):
    """An output could not be handed to the producer even after retries: its input must not be committed, the worker stops."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often a failing step is tried, and how long to wait between tries (exponential backoff)."""

    attempts: int = 3
    backoff_ms: int = 100
    max_backoff_ms: int = 2000

    def __post_init__(self) -> None:
        if self.attempts < 1:
            message = f"retry policy: attempts must be at least 1, got {self.attempts}"
            raise ValueError(message)

    def delay_ms(self, failed_attempt: int) -> int:
        """The wait after the ``failed_attempt``-th try (1-based) before the next one."""
        return int(min(self.max_backoff_ms, self.backoff_ms * 2 ** (failed_attempt - 1)))


@dataclass(slots=True)
class StepOutcome:
    """What a retried step gave: its value, or the last error after every attempt.

    Not frozen: one is made per item, and a frozen dataclass's ``__init__`` (``object.__setattr__`` per field)
    took three times as long, a tenth of an inline splitter's CPU per order. Nothing changes one once made.
    """

    ok: bool
    value: Any
    error: str | None
    attempts: int


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


#: The attempt the running step is (1 the first time; 2 and on when the retry policy runs it again).
_attempt: contextvars.ContextVar[int] = contextvars.ContextVar("weir_step_attempt", default=1)


def attempt() -> int:
    """Which attempt of the step running now this is: 1 the first time, then 2, 3... when the retry policy runs it
    again after a failure (Camel's ``CamelRedeliveryCounter`` + 1). A step may read it to know it is a redelivery."""
    return _attempt.get()


async def run_with_retry(
    policy: RetryPolicy,
    step: Callable[[], Awaitable[T] | T],
    *,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    failed: BaseException | None = None,
) -> StepOutcome:
    """Run ``step`` until it succeeds or the policy's attempts are spent; never raises the step's error.

    ``failed``: the error of a first attempt the caller made itself (a sync step tried in place, without a
    coroutine: :class:`app.aggregation.ItemWorker`); the retries go on from the second attempt. ``sleep``: how a
    backoff waits (default: the environment's clock, :mod:`app.runtime.environment`; a test driver's is virtual).
    """
    if sleep is None:
        sleep = environment.current().clock.sleep
    attempt = 0
    if failed is not None:
        attempt = 1
        if attempt >= policy.attempts:
            return StepOutcome(ok=False, value=None, error=describe_error(failed), attempts=attempt)
        await sleep(policy.delay_ms(attempt) / 1000)
    while True:
        attempt += 1
        token = _attempt.set(attempt)
        try:
            value = step()
            if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
                value = await value
            return StepOutcome(ok=True, value=value, error=None, attempts=attempt)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a user step may raise anything; that is what the policy is for
            if attempt >= policy.attempts:
                return StepOutcome(ok=False, value=None, error=describe_error(error), attempts=attempt)
            await sleep(policy.delay_ms(attempt) / 1000)
        finally:
            _attempt.reset(token)


def _bytes_field(raw: bytes | None) -> dict[str, Any]:
    if raw is None:
        return {"text": None, "base64": None}
    try:
        return {"text": raw.decode("utf-8"), "base64": None}
    except UnicodeDecodeError:
        return {"text": None, "base64": base64.b64encode(raw).decode("ascii")}


def dead_letter_record(
    *,
    reason: str,
    error: str,
    agent: str,
    step: str,
    attempts: int,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes]] = (),
    now_ms: int | None = None,
) -> dict[str, Any]:
    """A dead letter: the original message (key, value, headers, origin), where it failed, and why.

    ``reason`` is one of "undecodable", "invalid" (schema), "failed" (retries spent), "rejected" (a state
    core refused it), "timeout".
    """
    return {
        "reason": reason,
        "error": error,
        "agent": agent,
        "step": step,
        "attempts": attempts,
        "origin": {"topic": topic, "partition": partition, "offset": offset},
        "key": _bytes_field(key),
        "value": _bytes_field(value),
        "headers": [[name, _bytes_field(raw)] for name, raw in headers],
        "failed_ms": environment.current().clock.now_ms() if now_ms is None else now_ms,
    }


#: What an agent's dead letters go through before they are stored: the original bytes in, what may be kept out
#: (masking card numbers, say). It receives every original key, value and header value, and the error text's bytes.
Redaction = Callable[[bytes], bytes]


def _field_bytes(field: Any) -> bytes | None:
    """The original bytes of a ``_bytes_field`` value (None for a missing one)."""
    if not isinstance(field, Mapping):
        return None
    if field.get("text") is not None:
        return str(field["text"]).encode("utf-8", "surrogatepass")
    if field.get("base64") is not None:
        return base64.b64decode(str(field["base64"]))
    return None


def redacted_dead_letter(record: Mapping[str, Any], redact: Redaction) -> dict[str, Any]:
    """``record`` (:func:`dead_letter_record`) with its original key, value, header values and error through ``redact``.

    Bytes that are not UTF-8 reach ``redact`` as they came (a card number in a binary record is masked too); what
    it returns is stored as text when it is UTF-8, else as base64, as any dead letter's bytes.
    """

    def through(field: Any) -> Any:
        raw = _field_bytes(field)
        return field if raw is None else _bytes_field(redact(raw))

    redacted = dict(record)
    redacted["key"] = through(record.get("key"))
    redacted["value"] = through(record.get("value"))
    redacted["headers"] = [[name, through(raw)] for name, raw in record.get("headers") or []]
    error = str(record.get("error", ""))
    redacted["error"] = redact(error.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")
    return redacted


#: Fixed upper bounds on what a dead letter carries besides its payload, so that the payload keeps most of the room.
_ERROR_CHARS = 4096
_KEY_CHARS = 1024
_HEADER_COUNT = 32
_HEADER_CHARS = 256


def fitted_dead_letter(record: dict[str, Any], limit: int) -> bytes:
    """``record`` (:func:`dead_letter_record`) encoded in at most ``limit`` bytes: never dropped, cut to fit.

    A record that fits is encoded as it is. Otherwise its error, key and headers are cut to fixed bounds and
    its value to what room is left; every cut field says so (``truncated``) and keeps the original's size in
    bytes and its sha256, so the payload can still be matched with its source. ``reason``, ``agent``,
    ``step`` and ``origin`` are always kept. ``limit`` must leave room for those (a few hundred bytes).
    """
    encoded = _dumps(record)
    if len(encoded) <= limit:
        return encoded
    cut = dict(record)
    cut["error"] = _cut_text(str(record.get("error", "")), _ERROR_CHARS)
    cut["key"] = _cut_field(record.get("key"), _KEY_CHARS)
    headers = list(record.get("headers") or [])
    cut["headers"] = [[_cut_text(str(name), _HEADER_CHARS), _cut_field(raw, _HEADER_CHARS)] for name, raw in headers[:_HEADER_COUNT]]
    if len(headers) > _HEADER_COUNT:
        cut["headers_dropped"] = len(headers) - _HEADER_COUNT
    cut["value"] = _cut_field(record.get("value"), 0)
    room = limit - len(_dumps(cut))
    # The value's prefix grows to the room left: JSON may escape one character into up to six bytes, so measure.
    chars = max(0, room)
    while True:
        cut["value"] = _cut_field(record.get("value"), chars)
        encoded = _dumps(cut)
        if len(encoded) <= limit or chars == 0:
            break
        chars = max(0, chars * limit // len(encoded) - 16)
    if len(encoded) > limit:
        message = f"dead letter: {len(encoded)} bytes even with its payload cut, over the limit of {limit}"
        raise ValueError(message)
    return encoded


def _cut_text(text: str, chars: int) -> str:
    return text if len(text) <= chars else f"{text[:chars]}... ({len(text)} characters, cut)"


def _cut_field(field: Any, chars: int) -> Any:
    """A ``_bytes_field`` value cut to ``chars`` characters of its text (or base64), with the original's size and sha256."""
    if not isinstance(field, dict):
        return field
    text, encoded64 = field.get("text"), field.get("base64")
    if text is None and encoded64 is None:
        return field
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else base64.b64decode(str(encoded64))
    shown = text if isinstance(text, str) else str(encoded64)
    if len(shown) <= chars:
        return field
    return {
        "text": shown[:chars] if isinstance(text, str) else None,
        "base64": shown[: chars - chars % 4] if text is None else None,
        "truncated": True,
        "size_bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
