"""An end-of-stream job of the tests' own (WEIR_EOF_JOB=tests.integration.eof_jobs:WORDS): words counted per client."""

from __future__ import annotations

import random
from typing import Any

from weir.tables.eof import Dropped, EofJob

WORDS_SAID = ("stream", "batch", "client", "count", "merge", "join")


def word_lines(rng: random.Random, count: int) -> list[Any]:
    """Lines of words; about one in ten is a number or blank (the filter drops those)."""
    lines: list[Any] = []
    for _ in range(count):
        roll = rng.random()
        lines.append(rng.randint(0, 9) if roll < 0.05 else "  " if roll < 0.1 else " ".join(rng.choices(WORDS_SAID, k=rng.randint(1, 5))))
    return lines


def select(record: Any) -> str:
    if not isinstance(record, str) or not record.strip():
        raise Dropped("not a line of words")
    return record


def merge(totals: dict[str, int], line: str) -> dict[str, int]:
    if line == "poison":
        raise ValueError("poison in the merge")
    for word in line.split():
        totals[word] = totals.get(word, 0) + 1
    return totals


def join(client: str, totals: dict[str, int], side: Any) -> dict[str, Any]:
    """The words said at least ``side`` times (None: once)."""
    least = 1 if side is None else int(side)
    return {"words": {word: count for word, count in sorted(totals.items()) if count >= least}}


WORDS = EofJob("words", select=select, zero=dict, merge=merge, join=join)


def _number(record: Any) -> int:
    if isinstance(record, bool) or not isinstance(record, int):
        raise Dropped("not a number")
    return record


#: A second job of the tests' own: the numbers a client sent, summed (what is not a number is dropped).
SUMS = EofJob(
    "sums", select=_number, zero=lambda: 0, merge=lambda total, number: total + number, join=lambda client, total, side: {"sum": total}
)
