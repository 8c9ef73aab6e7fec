"""The demo command with four lines that once stopped it, in one screen beside two ordinary screens.

Each of these lines ended ``make demo`` with rc=1 and no report for any screen: a 2 KB line nested 1,000 deep
(the decoder's RecursionError), a 300 KB line of escaped quotes (its dead letter grew to 1.2 MB), a line of
1.01 MB (over a record) and one of 5 MB (over the screen's own producer). Now the command exits 0, every
screen's report is printed, and the four lines are counted invalid, each with its reason.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from scripts.make_shop_orders import order_lines
from tests.conftest import ROOT
from weir.app.kafka_io import delete_topics, read_topic

pytestmark = pytest.mark.integration

BAD_LINES = {
    "nested": "[" * 1000 + "]" * 1000,
    "escaped quotes": '"' + '\\"' * 150_000 + '"',
    "1.01 MB": '{"order_id": "' + "y" * 1_010_000 + '"}',
    "5 MB": "z" * 5_000_000,
}
REPORT = re.compile(r"^\s+(\S+)\s+lines\s+(\d+)\s+served\s+(\d+)\s+aborted\s+(\d+) \(.*\)\s+invalid\s+(\d+)", re.MULTILINE)


def test_the_demo_serves_every_screen_when_one_screen_has_poison_lines(kafka_bootstrap: str, tmp_path: Path) -> None:
    orders = tmp_path / "orders"
    orders.mkdir()
    rng = random.Random(3)
    for number in (1, 2):
        (orders / f"plain-{number}.jsonl").write_text("\n".join(order_lines(number, 6, rng, scarce_screen=False)) + "\n")
    good = order_lines(9, 2, rng, scarce_screen=False)
    (orders / "poisoned.jsonl").write_text("\n".join([good[0], *BAD_LINES.values(), good[1]]) + "\n")
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "shop.demo", "--orders", str(orders), "--timeout", "60", "--keep"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    prefix = re.search(r"topics (\S+)\*", done.stdout)
    try:
        _check(done, prefix, kafka_bootstrap)
    finally:
        if prefix is not None:
            asyncio.run(delete_topics(kafka_bootstrap, prefix.group(1).rstrip(".")))


def _check(done: subprocess.CompletedProcess[str], prefix: re.Match[str] | None, kafka_bootstrap: str) -> None:
    assert done.returncode == 0, f"the demo failed (rc={done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    reports = {name: tuple(map(int, numbers)) for name, *numbers in REPORT.findall(done.stdout)}
    assert set(reports) == {"plain-1", "plain-2", "poisoned"}, done.stdout[-3000:]
    lines, served, aborted, invalid = reports["poisoned"]
    assert lines == 6
    assert invalid >= 4, "the four poison lines are counted invalid"
    assert served + aborted + invalid == 6
    for name in ("plain-1", "plain-2"):
        assert reports[name][0] == 6

    assert prefix is not None
    outcomes = asyncio.run(
        read_topic(kafka_bootstrap, f"{prefix.group(1)}shop.outcomes", until=lambda _: False, timeout_s=5, decode=orjson.loads)
    )
    reasons = {outcome["line"]: outcome["reason"] for outcome in outcomes if outcome["screen"].endswith("/poisoned")}
    assert "broken line: RecursionError" in reasons[2]
    assert "an order must be a JSON object" in reasons[3]
    assert reasons[4].startswith("line too large: 1010")
    assert reasons[5].startswith("line too large: 5000000 bytes")
