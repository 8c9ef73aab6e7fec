"""Card numbers in the shop: the Luhn check, the token and last four digits that travel instead, masking in raw text.

A full card number never leaves the place it is read. The screen (the shop's terminal, where the customer
hands the card over) replaces a line's ``card`` with a :class:`CardRef` before the line is written to
Kafka: a keyed token (HMAC-SHA256 of the digits with a per-run secret), the last four digits and whether
the number passes the Luhn check. Whatever else on a line looks like a card number is masked. The payment
gateway decides on that fact and its seeded draw; it never sees the number. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CardRef", "luhn_valid", "card_ref", "mask_card_numbers", "protect_line"]

#: 13 to 19 digits, up to two separators between two of them (spaces, tabs, dashes, dots, slashes, underscores): cards
#: are written "4111 1111 1111 1111", "4111-1111-...", "4111.1111...", with two spaces, or with slashes in a note.
CARD_NUMBER = re.compile(r"(?<!\d)(?:\d[ \t\-./\\_]{0,2}){12,18}\d(?!\d)")
#: Characters of a card's token after its ``tok_`` prefix (base32: letters and 2-7, never a long run of digits).
TOKEN_CHARS = 26


@dataclass(frozen=True)
class CardRef:
    """What travels instead of a card number: its keyed token, its last four digits and the Luhn fact."""

    token: str
    last4: str
    luhn_ok: bool

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "last4": self.last4, "luhn_ok": self.luhn_ok}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CardRef:
        token, last4, luhn_ok = raw.get("token"), raw.get("last4"), raw.get("luhn_ok")
        if not isinstance(token, str) or not token.startswith("tok_"):
            raise ValueError(f"a card reference needs a 'token' starting 'tok_', got {token!r:.40}")
        if not isinstance(last4, str) or len(last4) > 4 or not (last4.isdigit() or last4 == ""):
            raise ValueError(f"a card reference needs 'last4', at most four digits, got {last4!r:.40}")
        if not isinstance(luhn_ok, bool):
            raise ValueError(f"a card reference needs a boolean 'luhn_ok', got {luhn_ok!r:.40}")
        return cls(token, last4, luhn_ok)


def _digits(number: str) -> str:
    """The number without the spaces and dashes people write between groups."""
    return number.replace(" ", "").replace("-", "")


def luhn_valid(number: str) -> bool:
    """The Luhn (mod 10) check of a card number: 12 to 19 digits whose checksum ends in 0."""
    digits = _digits(number)
    if not digits.isascii() or not digits.isdigit() or not 12 <= len(digits) <= 19:
        return False
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def card_ref(number: str, key: bytes) -> CardRef:
    """The number's reference: the same number and key give the same token, so a replayed line gives the same record."""
    digits = _digits(number)
    digest = hmac.new(key, digits.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    token = "tok_" + base64.b32encode(digest).decode("ascii").lower()[:TOKEN_CHARS]
    last4 = "".join(char for char in digits if char.isascii() and char.isdigit())[-4:]
    return CardRef(token, last4, luhn_valid(number))


def mask_card_numbers(text: str) -> str:
    """``text`` with every run that looks like a card number masked but for its last four digits."""

    def mask(match: re.Match[str]) -> str:
        run = match.group(0)
        keep = 4
        masked = []
        for char in reversed(run):
            if char.isdigit() and keep > 0:
                keep -= 1
                masked.append(char)
            else:
                masked.append("*" if char.isdigit() else char)
        return "".join(reversed(masked))

    return CARD_NUMBER.sub(mask, text)


def protect_line(text: str, key: bytes) -> str:
    """A screen's line as it may be written to Kafka: its ``card`` as a :class:`CardRef`, any other card number masked.

    A line that is not a JSON object with a string ``card`` is only masked: it stays as broken as it was, and
    the shop answers it ``invalid`` as before.
    """
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raw = None
    if isinstance(raw, dict) and isinstance(raw.get("card"), str):
        raw["card"] = card_ref(raw["card"], key).to_dict()
        text = json.dumps(raw, ensure_ascii=False)
        if not _writable(text):  # an escaped lone surrogate (valid JSON) came back as one: keep it escaped
            text = json.dumps(raw, ensure_ascii=True)
    return mask_card_numbers(text)


def _writable(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
