"""The same order id twice on a screen's day: the demo charges the first line once and answers the second 'duplicate'.

Before, each line was an order of its own (keyed by its ticket), so a repeated order id was captured and
committed twice. Now the second line is refused with a dead letter 'duplicate-order', gets the outcome
'duplicate' with nothing charged, and the screen's end-of-day report counts it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from tests.conftest import ROOT
from weir.app.kafka_io import delete_topics, read_topic

pytestmark = pytest.mark.integration

REPORT = re.compile(
    r"^\s+(\S+)\s+lines\s+(\d+)\s+served\s+(\d+)\s+aborted\s+(\d+) \(.*\)\s+invalid\s+(\d+)\s+duplicate\s+(\d+)", re.MULTILINE
)


def _line(order_id: str, flavour: str) -> str:
    return json.dumps({"order_id": order_id, "card": "4111111111111111", "items": [{"flavour": flavour, "size": "small"}]})


def test_a_repeated_order_id_is_charged_once_and_reported_duplicate(kafka_bootstrap: str, tmp_path: Path) -> None:
    orders = tmp_path / "orders"
    orders.mkdir()
    # line 3 repeats line 1's id (with other items: still the same order id); the other screen may use it too
    (orders / "counter.jsonl").write_text(
        "\n".join([_line("o-1", "mint"), _line("o-2", "lemon"), _line("o-1", "vanilla"), _line("o-3", "mint")]) + "\n"
    )
    (orders / "terrace.jsonl").write_text(_line("o-1", "mint") + "\n")
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": str(ROOT), "WEIR_SHOP_CARD_REJECT_RATE": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "shop.demo", "--orders", str(orders), "--timeout", "60", "--keep"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    prefix = re.search(r"topics (\S+)\*", done.stdout)
    try:
        assert done.returncode == 0, f"the demo failed (rc={done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        assert prefix is not None
        _check(done.stdout, prefix.group(1), kafka_bootstrap)
    finally:
        if prefix is not None:
            asyncio.run(delete_topics(kafka_bootstrap, prefix.group(1).rstrip(".")))


def _check(stdout: str, prefix: str, kafka_bootstrap: str) -> None:
    reports = {name: tuple(map(int, numbers)) for name, *numbers in REPORT.findall(stdout)}
    assert reports == {"counter": (4, 3, 0, 0, 1), "terrace": (1, 1, 0, 0, 0)}, stdout[-3000:]

    def read(name: str) -> list[dict[str, object]]:
        return asyncio.run(read_topic(kafka_bootstrap, f"{prefix}{name}", until=lambda _: False, timeout_s=5, decode=orjson.loads))

    outcomes = {(str(o["screen"]).rsplit("/", 1)[-1], o["line"]): o for o in read("shop.outcomes")}
    assert len(outcomes) == 5
    duplicate = outcomes[("counter", 3)]
    assert (duplicate["status"], duplicate["amount_cents"], duplicate["order_id"]) == ("duplicate", 0, "o-1")
    assert "taken by line 1" in str(duplicate["reason"])
    assert outcomes[("counter", 1)]["status"] == "ready"
    assert outcomes[("terrace", 1)]["status"] == "ready", "an order id is a screen's own: another screen may use it"

    # One charge: the payment gateway never saw the duplicate line's ticket; each charged ticket captured and committed once.
    phases = Counter((str(t["order_id"]).split("/", 1)[1], t["phase"]) for t in read("shop.transactions"))
    assert not [ticket for ticket, _ in phases if ticket == "counter/3"], f"the duplicate was charged: {phases}"
    for ticket in ("counter/1", "counter/2", "counter/4", "terrace/1"):
        assert (phases[(ticket, "captured")], phases[(ticket, "committed")]) == (1, 1), f"{ticket}: {phases}"

    letters = [letter for letter in read("dead-letters") if letter["reason"] == "duplicate-order"]
    assert len(letters) == 1, letters
    assert "line 3" in str(letters[0]["error"])
