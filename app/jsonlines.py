"""Reading the JSON-lines files the demos take: one record per line, split on newlines only."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_lines"]


def read_lines(path: Path) -> list[str]:
    """A JSON-lines file's lines, split on newlines only (JSON strings may hold U+2028 or U+0085), without a BOM."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as error:
        message = f"{path}: not UTF-8 text ({error}); an order file holds one JSON object per line"
        raise ValueError(message) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]
