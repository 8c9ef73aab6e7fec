"""Writes the shop demo's order files (demo/shop/screen-N.jsonl): realistic orders, a few broken lines.

Deterministic (seeded). Card numbers pass the Luhn check but for about one in a hundred (mistyped).
Pistachio is ordered on the last screen only, in quantities beyond its opening stock in the demo
(WEIR_SHOP_STOCK_OVERRIDES=pistachio=120): those stock-outs do not depend on how the screens interleave,
so the same seed and files give the same reports.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

COMMON = ["vanilla", "chocolate", "strawberry", "lemon", "mint"]
SIZES = ["small", "medium", "large"]


def luhn_card(body: str) -> str:
    """``body`` with the check digit that makes it pass the Luhn check."""
    total = 0
    for position, char in enumerate(reversed(body)):
        value = int(char)
        if position % 2 == 0:  # doubled: these are the odd positions once the check digit is appended
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return body + str(-total % 10)


def order_lines(screen: int, count: int, rng: random.Random, scarce_screen: bool) -> list[str]:
    lines = []
    for number in range(1, count + 1):
        order_id = f"s{screen}-{number:04d}"
        if rng.random() < 0.01:
            lines.append(rng.choice(['{"order_id": "' + order_id + '", "items": [', "not json at all", ""]))
            continue
        flavours = list(COMMON) + (["pistachio"] * 3 if scarce_screen else [])
        items = [{"flavour": rng.choice(flavours), "size": rng.choice(SIZES)} for _ in range(rng.choice([1, 1, 2, 2, 3]))]
        if rng.random() < 0.005:
            items[0]["flavour"] = "durian"  # not on the menu
        card = luhn_card(f"4{rng.randrange(10**14):014d}")
        if rng.random() < 0.01:
            card = card[:-1] + str((int(card[-1]) + 1) % 10)  # mistyped: fails the Luhn check, the gateway rejects it
        lines.append(json.dumps({"order_id": order_id, "card": card, "items": items}))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--screens", type=int, default=3)
    parser.add_argument("--orders", type=int, default=300, help="orders per screen")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--out", type=Path, default=Path("demo/shop"))
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(arguments.seed)
    for screen in range(1, arguments.screens + 1):
        lines = order_lines(screen, arguments.orders, rng, scarce_screen=screen == arguments.screens)
        (arguments.out / f"screen-{screen}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
