"""Reading the JSON-lines files the demos take: one record per line, split on newlines only."""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_lines", "split_lines"]

_BOM = b"\xef\xbb\xbf"


def split_lines(raw: bytes) -> list[bytes]:
    """A JSON-lines file's lines as bytes: split on newlines only (JSON strings may hold U+2028 or U+0085; a UTF-8
    newline byte is never part of another character), without a BOM, a line's closing CR, or an empty last line."""
    lines = raw.removeprefix(_BOM).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def read_lines(path: Path) -> list[str]:
    """A JSON-lines file's lines (:func:`split_lines`), decoded; a file with a line that is not UTF-8 is refused."""
    lines = []
    for number, line in enumerate(split_lines(path.read_bytes()), start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            message = f"{path}: not UTF-8 text (line {number}: {error}); an order file holds one JSON object per line"
            raise ValueError(message) from None
    return lines
