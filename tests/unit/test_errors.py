"""Unit tests for ``app/errors.py``: retry policy, retried steps (sync and async) and dead-letter records.

No real sleeping: ``run_with_retry`` gets a fake ``sleep`` that records the delays it was asked for.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weir.app.errors import RetryPolicy, StepOutcome, dead_letter_record, describe_error, run_with_retry

FAST = settings(max_examples=200, deadline=None, database=None)


class FakeSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class Flaky:
    """A step that raises ``failures`` times, then returns ``value``; counts its calls."""

    def __init__(self, failures: int, value: Any = "done", error: Exception | None = None) -> None:
        self.failures = failures
        self.value = value
        self.error = error if error is not None else RuntimeError("broker unavailable")
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return self.value


class AsyncFlaky(Flaky):
    def __call__(self) -> Any:  # returns a coroutine, like an ``async def`` step
        async def run() -> Any:
            await asyncio.sleep(0)
            return Flaky.__call__(self)

        return run()


def retry(policy: RetryPolicy, step: Callable[[], Any], sleep: FakeSleep) -> StepOutcome:
    return asyncio.run(run_with_retry(policy, step, sleep=sleep))


# --------------------------------------------------------------------------------------------------------------
# RetryPolicy.
# --------------------------------------------------------------------------------------------------------------


def test_policy_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.attempts, policy.backoff_ms, policy.max_backoff_ms) == (3, 100, 2000)


def test_delay_is_exponential_then_capped() -> None:
    policy = RetryPolicy(attempts=10, backoff_ms=100, max_backoff_ms=1000)
    assert [policy.delay_ms(attempt) for attempt in range(1, 8)] == [100, 200, 400, 800, 1000, 1000, 1000]


def test_delay_with_cap_below_base_is_the_cap() -> None:
    assert RetryPolicy(backoff_ms=500, max_backoff_ms=300).delay_ms(1) == 300


@FAST
@given(
    backoff=st.integers(min_value=0, max_value=10_000),
    cap=st.integers(min_value=0, max_value=100_000),
    attempt=st.integers(min_value=1, max_value=64),
)
def test_delay_property(backoff: int, cap: int, attempt: int) -> None:
    policy = RetryPolicy(attempts=1, backoff_ms=backoff, max_backoff_ms=cap)
    delay = policy.delay_ms(attempt)
    assert isinstance(delay, int)
    assert delay == min(cap, backoff * 2 ** (attempt - 1))
    assert 0 <= delay <= cap
    assert policy.delay_ms(attempt + 1) >= delay


@pytest.mark.parametrize("attempts", [0, -1, -5])
def test_policy_rejects_fewer_than_one_attempt(attempts: int) -> None:
    with pytest.raises(ValueError, match=rf"attempts must be at least 1, got {attempts}"):
        RetryPolicy(attempts=attempts)


# --------------------------------------------------------------------------------------------------------------
# run_with_retry.
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("step_type", [Flaky, AsyncFlaky])
def test_succeeds_first_try(step_type: type[Flaky]) -> None:
    sleep = FakeSleep()
    step = step_type(failures=0, value={"id": 7})
    outcome = retry(RetryPolicy(attempts=3), step, sleep)
    assert outcome == StepOutcome(ok=True, value={"id": 7}, error=None, attempts=1)
    assert step.calls == 1
    assert sleep.delays == []


@pytest.mark.parametrize("step_type", [Flaky, AsyncFlaky])
@pytest.mark.parametrize("failures", [1, 2, 4])
def test_succeeds_after_failures(step_type: type[Flaky], failures: int) -> None:
    sleep = FakeSleep()
    step = step_type(failures=failures, value=42)
    policy = RetryPolicy(attempts=5, backoff_ms=100, max_backoff_ms=350)
    outcome = retry(policy, step, sleep)
    assert outcome == StepOutcome(ok=True, value=42, error=None, attempts=failures + 1)
    assert step.calls == failures + 1
    assert sleep.delays == [policy.delay_ms(attempt) / 1000 for attempt in range(1, failures + 1)]
    assert sleep.delays[:3] == [0.1, 0.2, 0.35][:failures]


@pytest.mark.parametrize("step_type", [Flaky, AsyncFlaky])
@pytest.mark.parametrize("attempts", [1, 3])
def test_gives_up_after_attempts(step_type: type[Flaky], attempts: int) -> None:
    sleep = FakeSleep()
    step = step_type(failures=100, error=ConnectionError("broker down"))
    outcome = retry(RetryPolicy(attempts=attempts, backoff_ms=10, max_backoff_ms=1000), step, sleep)
    assert outcome == StepOutcome(ok=False, value=None, error="ConnectionError: broker down", attempts=attempts)
    assert step.calls == attempts
    assert sleep.delays == [0.01, 0.02][: attempts - 1]  # no wait after the last attempt


@FAST
@given(
    attempts=st.integers(min_value=1, max_value=8),
    failures=st.integers(min_value=0, max_value=12),
    is_async=st.booleans(),
)
def test_retry_property(attempts: int, failures: int, is_async: bool) -> None:
    sleep = FakeSleep()
    step = (AsyncFlaky if is_async else Flaky)(failures=failures, value="v", error=KeyError("k"))
    policy = RetryPolicy(attempts=attempts, backoff_ms=50, max_backoff_ms=300)
    outcome = retry(policy, step, sleep)
    tries = min(failures + 1, attempts)
    assert step.calls == tries
    assert outcome.attempts == tries
    assert outcome.ok == (failures < attempts)
    assert outcome.value == ("v" if outcome.ok else None)
    assert outcome.error == (None if outcome.ok else "KeyError: 'k'")
    assert sleep.delays == [policy.delay_ms(attempt) / 1000 for attempt in range(1, tries)]


def test_last_error_is_reported() -> None:
    errors = iter([ValueError("first"), TypeError("second")])

    def step() -> None:
        raise next(errors)

    outcome = retry(RetryPolicy(attempts=2, backoff_ms=1), step, FakeSleep())
    assert outcome.error == "TypeError: second"


def test_async_function_step_is_awaited() -> None:
    async def step() -> str:
        return "awaited"

    outcome = retry(RetryPolicy(attempts=1), step, FakeSleep())
    assert outcome.ok
    assert outcome.value == "awaited"


def test_step_returning_a_future_is_awaited() -> None:
    async def main() -> StepOutcome:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(5)
        return await run_with_retry(RetryPolicy(attempts=1), lambda: future, sleep=FakeSleep())

    outcome = asyncio.run(main())
    assert outcome.ok
    assert outcome.value == 5


def test_step_returning_none_is_a_success() -> None:
    outcome = retry(RetryPolicy(attempts=2), lambda: None, FakeSleep())
    assert outcome == StepOutcome(ok=True, value=None, error=None, attempts=1)


def test_cancellation_is_not_retried() -> None:
    sleep = FakeSleep()
    calls = 0

    def step() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        retry(RetryPolicy(attempts=5), step, sleep)
    assert calls == 1
    assert sleep.delays == []


def test_describe_error() -> None:
    assert describe_error(ValueError("bad value")) == "ValueError: bad value"
    assert describe_error(RuntimeError()) == "RuntimeError: "


# --------------------------------------------------------------------------------------------------------------
# dead_letter_record.
# --------------------------------------------------------------------------------------------------------------


def record(**overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "reason": "failed",
        "error": "RuntimeError: boom",
        "agent": "aggregator",
        "step": "merge",
        "attempts": 3,
        "topic": "items",
        "partition": 2,
        "offset": 1234,
        "key": b"order-1",
        "value": b'{"x": 1}',
        "now_ms": 1_700_000_000_000,
    }
    arguments.update(overrides)
    return dead_letter_record(**arguments)


def test_dead_letter_carries_origin_and_context() -> None:
    letter = record(headers=[("trace", b"abc"), ("bin", b"\xff\x00")])
    assert letter == {
        "reason": "failed",
        "error": "RuntimeError: boom",
        "agent": "aggregator",
        "step": "merge",
        "attempts": 3,
        "origin": {"topic": "items", "partition": 2, "offset": 1234},
        "key": {"text": "order-1", "base64": None},
        "value": {"text": '{"x": 1}', "base64": None},
        "headers": [["trace", {"text": "abc", "base64": None}], ["bin", {"text": None, "base64": "/wA="}]],
        "failed_ms": 1_700_000_000_000,
    }
    json.dumps(letter)  # a dead letter must be JSON-serializable as is


def test_dead_letter_keeps_utf8_text_as_text() -> None:
    letter = record(key="clé".encode(), value="naïve ☃".encode())
    assert letter["key"] == {"text": "clé", "base64": None}
    assert letter["value"] == {"text": "naïve ☃", "base64": None}


def test_dead_letter_encodes_non_utf8_as_base64() -> None:
    raw = b"\x80\x81\xfe\xffnot text"
    letter = record(value=raw, key=b"\xc3\x28")
    assert letter["value"] == {"text": None, "base64": base64.b64encode(raw).decode("ascii")}
    assert base64.b64decode(letter["value"]["base64"]) == raw
    assert base64.b64decode(letter["key"]["base64"]) == b"\xc3\x28"


def test_dead_letter_missing_key_and_value() -> None:
    letter = record(key=None, value=None)
    assert letter["key"] == {"text": None, "base64": None}
    assert letter["value"] == {"text": None, "base64": None}
    assert letter["headers"] == []


def test_dead_letter_empty_bytes_are_empty_text() -> None:
    assert record(value=b"")["value"] == {"text": "", "base64": None}


def test_dead_letter_headers_accept_any_iterable_and_keep_order() -> None:
    headers = (pair for pair in [("b", b"2"), ("a", b"1"), ("b", b"3")])
    letter = record(headers=headers)
    assert [name for name, _ in letter["headers"]] == ["b", "a", "b"]
    assert [field["text"] for _, field in letter["headers"]] == ["2", "1", "3"]


def test_dead_letter_defaults_to_wall_clock() -> None:
    before = int(time.time() * 1000)
    letter = record(now_ms=None)
    after = int(time.time() * 1000)
    assert before <= letter["failed_ms"] <= after


@FAST
@given(raw=st.binary(max_size=64))
def test_dead_letter_bytes_are_recoverable(raw: bytes) -> None:
    field = record(value=raw)["value"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert field["text"] is None
        assert base64.b64decode(field["base64"]) == raw
    else:
        assert field == {"text": text, "base64": None}
