"""The wire format of weir's own messages: JSON through orjson, with clear errors for bad input."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["dumps", "loads", "DecodeError"]


class DecodeError(ValueError):
    """A message could not be decoded; the text says where and why."""


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(raw: bytes | None, *, what: str, max_bytes: int) -> Any:
    """Decode one JSON message or raise :class:`DecodeError` naming ``what`` was read."""
    if raw is None:
        message = f"{what}: the message has no value (tombstone), expected a JSON object"
        raise DecodeError(message)
    if len(raw) > max_bytes:
        message = f"{what}: the message is {len(raw)} bytes, more than the limit of {max_bytes}"
        raise DecodeError(message)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        message = f"{what}: not valid JSON ({error})"
        raise DecodeError(message) from None
