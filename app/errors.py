"""Shared error handling: a retry policy for failing steps and dead-letter records for what cannot go on."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["RetryPolicy", "StepOutcome", "run_with_retry", "dead_letter_record", "describe_error"]

T = TypeVar("T")


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


@dataclass(frozen=True)
class StepOutcome:
    """What a retried step gave: its value, or the last error after every attempt."""

    ok: bool
    value: Any
    error: str | None
    attempts: int


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


async def run_with_retry(
    policy: RetryPolicy,
    step: Callable[[], Awaitable[T] | T],
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> StepOutcome:
    """Run ``step`` until it succeeds or the policy's attempts are spent; never raises the step's error."""
    attempt = 0
    while True:
        attempt += 1
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
        "failed_ms": int(time.time() * 1000) if now_ms is None else now_ms,
    }
