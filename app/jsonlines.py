"""Reading the JSON-lines files the demos and the EOF gateway take: one record per line, split on newlines only."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["read_lines", "split_lines"]

_BOM = b"\xef\xbb\xbf"


def split_lines(raw: bytes) -> list[bytes]:
    """A JSON-lines file's lines as bytes: split on newlines only (JSON strings may hold U+2028 or U+0085; a UTF-8
    newline byte is never part of another character), without a BOM, a line's closing CR, or an empty last line."""
    lines = raw.removeprefix(_BOM).split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def read_lines(path: Path) -> list[str | dict[str, Any]]:
    """A JSON-lines file's lines (:func:`split_lines`), decoded. A line that is not UTF-8 does not refuse the file: it
    is kept as ``{"unreadable": "not UTF-8 text: ...", "line", "size_bytes", "sha256"}`` (never its bytes), a record
    the job's ``select`` drops like any record it cannot use, and the other lines go on."""
    lines: list[str | dict[str, Any]] = []
    for number, line in enumerate(split_lines(path.read_bytes()), start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as error:
            lines.append(
                {
                    "unreadable": f"not UTF-8 text: {error}",
                    "line": number,
                    "size_bytes": len(line),
                    "sha256": hashlib.sha256(line).hexdigest(),
                }
            )
    return lines
