"""The demo command (``make demo``'s ``python -m shop.demo``) on one day of three screens that hold what once broke it.

- **Poison lines** (screen ``poisoned``): a 2 KB line nested 1,000 deep (the decoder's RecursionError), a 300 KB
  line of escaped quotes (its dead letter grew to 1.2 MB), a line of 1.01 MB (over a record) and one of 5 MB (over
  the screen's own producer). Each once ended the command with rc=1 and no report for any screen. Then a line whose
  order id is an escaped lone surrogate (it ended its screen with a TypeError) and one that is not UTF-8 (the demo
  refused the whole folder, exit 2). Now it exits 0, every screen's report is printed, and the six lines are counted
  invalid, each with its reason.
- **A repeated order id** (screen ``counter``): each line was once an order of its own (keyed by its ticket), so
  the id was captured and committed twice. Now the second line is refused with a dead letter 'duplicate-order',
  gets the outcome 'duplicate' with nothing charged, and the end-of-day report counts it. Another screen
  (``terrace``) may use the same id.

One run of the command serves both tests (a run starts the shop's seven workers).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from scripts.make_shop_orders import order_lines
from shop.demo import STAGES
from tests.conftest import ROOT
from tests.integration.conftest import free_port_block
from weir.app.kafka_io import delete_topics, read_to_end

#: the shop's and the chaos run's workers load the 2 cores: these modules run one after another in one pytest process
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shop")]

BAD_LINES = {
    "nested": "[" * 1000 + "]" * 1000,
    "escaped quotes": '"' + '\\"' * 150_000 + '"',
    "1.01 MB": '{"order_id": "' + "y" * 1_010_000 + '"}',
    "5 MB": "z" * 5_000_000,
}
REPORT = re.compile(
    r"^\s+(\S+)\s+lines\s+(\d+)\s+served\s+(\d+)\s+aborted\s+(\d+) \(.*\)\s+invalid\s+(\d+)\s+duplicate\s+(\d+)", re.MULTILINE
)


def _line(order_id: str, flavour: str) -> str:
    return json.dumps({"order_id": order_id, "card": "4111111111111111", "items": [{"flavour": flavour, "size": "small"}]})


@dataclass
class DemoRun:
    done: subprocess.CompletedProcess[str]
    prefix: str
    bootstrap: str

    def reports(self) -> dict[str, tuple[int, ...]]:
        """Each screen's printed report: lines, served, aborted, invalid, duplicate."""
        return {name: tuple(map(int, numbers)) for name, *numbers in REPORT.findall(self.done.stdout)}

    def read(self, name: str) -> list[Any]:
        return asyncio.run(read_to_end(self.bootstrap, f"{self.prefix}{name}", decode=orjson.loads))


@pytest.fixture(scope="module")
def demo(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    orders = tmp_path_factory.mktemp("orders")
    good = order_lines(9, 2, random.Random(3), scarce_screen=False)
    # then a line whose order id is an escaped lone surrogate (valid JSON text, no UTF-8 record can hold the id) and a
    # line that is not UTF-8 (the demo read the whole folder as text, and refused it)
    surrogate = '{"order_id": "s-\\udc80", "card": "4111111111111111", "items": [{"flavour": "mint", "size": "small"}]}'
    lines = [good[0], *BAD_LINES.values(), surrogate]
    (orders / "poisoned.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe not text\n" + (good[1] + "\n").encode())
    # line 3 repeats line 1's id (with other items: still the same order id); the other screen may use it too
    (orders / "counter.jsonl").write_text(
        "\n".join([_line("o-1", "mint"), _line("o-2", "lemon"), _line("o-1", "vanilla"), _line("o-3", "mint")]) + "\n"
    )
    (orders / "terrace.jsonl").write_text(_line("o-1", "mint") + "\n")
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": str(ROOT), "WEIR_SHOP_CARD_REJECT_RATE": "0"}
    # web ports of its own: the demo's default (6066 and up) was taken once by the same demo run in the other test
    # process (pytest 9.2 ignores xdist's loadgroup: a module's tests may run in both processes, each with its fixture)
    env["WEIR_DEMO_WEB_PORT"] = str(free_port_block(len(STAGES)))
    done = subprocess.run(
        [sys.executable, "-m", "shop.demo", "--orders", str(orders), "--timeout", "60", "--keep"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    prefix = re.search(r"topics (\S+)\*", done.stdout)
    assert done.returncode == 0, f"the demo failed (rc={done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert prefix is not None, done.stdout[-3000:]
    try:
        yield DemoRun(done, prefix.group(1), kafka_bootstrap)
    finally:
        asyncio.run(delete_topics(kafka_bootstrap, prefix.group(1).rstrip(".")))


def test_the_demo_serves_every_screen_when_one_screen_has_poison_lines(demo: DemoRun) -> None:
    reports = demo.reports()
    assert set(reports) == {"counter", "poisoned", "terrace"}, demo.done.stdout[-3000:]
    lines, served, aborted, invalid, _ = reports["poisoned"]
    assert lines == 8
    assert invalid >= 6, "the six poison lines are counted invalid"
    assert served + aborted + invalid == 8
    assert (reports["counter"][0], reports["terrace"][0]) == (4, 1), "the other screens were served whole"
    # each screen's per-order latency, over every line it was answered (poison lines included)
    latency = dict(re.findall(r"^  (\w+) +p50 +[\d,]+ ms +p99 +[\d,]+ ms +\((\d+) lines\)$", demo.done.stdout, re.MULTILINE))
    assert latency == {"counter": "4", "poisoned": "8", "terrace": "1", "all": "13"}, demo.done.stdout[-3000:]

    reasons = {outcome["line"]: outcome["reason"] for outcome in demo.read("shop.outcomes") if outcome["screen"].endswith("/poisoned")}
    assert "broken line: RecursionError" in reasons[2]
    assert "an order must be a JSON object" in reasons[3]
    assert reasons[4].startswith("line too large: 1010")
    assert reasons[5].startswith("line too large: 5000000 bytes")
    assert "surrogates not allowed" in reasons[6]
    assert reasons[7].startswith("unreadable line: not UTF-8 text")


def test_a_repeated_order_id_is_charged_once_and_reported_duplicate(demo: DemoRun) -> None:
    reports = demo.reports()
    assert (reports["counter"], reports["terrace"]) == ((4, 3, 0, 0, 1), (1, 1, 0, 0, 0)), demo.done.stdout[-3000:]

    outcomes = {
        (str(o["screen"]).rsplit("/", 1)[-1], o["line"]): o
        for o in demo.read("shop.outcomes")
        if str(o["screen"]).rsplit("/", 1)[-1] in ("counter", "terrace")
    }
    assert len(outcomes) == 5
    duplicate = outcomes[("counter", 3)]
    assert (duplicate["status"], duplicate["amount_cents"], duplicate["order_id"]) == ("duplicate", 0, "o-1")
    assert "taken by line 1" in str(duplicate["reason"])
    assert outcomes[("counter", 1)]["status"] == "ready"
    assert outcomes[("terrace", 1)]["status"] == "ready", "an order id is a screen's own: another screen may use it"

    # One charge: the payment gateway never saw the duplicate line's ticket; each charged ticket captured and committed once.
    phases = Counter((str(t["order_id"]).split("/", 1)[1], t["phase"]) for t in demo.read("shop.transactions"))
    assert not [ticket for ticket, _ in phases if ticket == "counter/3"], f"the duplicate was charged: {phases}"
    for ticket in ("counter/1", "counter/2", "counter/4", "terrace/1"):
        assert (phases[(ticket, "captured")], phases[(ticket, "committed")]) == (1, 1), f"{ticket}: {phases}"

    letters = [letter for letter in demo.read("dead-letters") if letter["reason"] == "duplicate-order"]
    assert len(letters) == 1, letters
    assert "line 3" in str(letters[0]["error"])
