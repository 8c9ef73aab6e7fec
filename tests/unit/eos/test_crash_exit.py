"""A crashed worker's process ends (app.engine.exits): a Faust app's crash arms a timer, and a process still alive
when it fires exits with code 1, saying why. In a subprocess: a Faust app crashed while nothing stops it (as after
a crash during a rebalance), then the process sleeps."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

SCRIPT = """
import asyncio, time
import faust
from weir.app.engine import exits
exits.EXIT_GRACE_S = 0.5
exits.exit_after_crash()
exits.exit_after_crash()  # idempotent: one wrapper
app = faust.App("crash-exit-test", broker="kafka://127.0.0.1:1")
asyncio.run(app.crash(RuntimeError("fenced")))
time.sleep(60)
print("still alive")
"""


def test_a_crashed_app_whose_worker_does_not_stop_ends_its_process() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "still alive" not in done.stdout
    assert "has not stopped 0.5 s after its crash (RuntimeError('fenced')): its process exits now" in done.stderr


def test_without_a_crash_nothing_exits() -> None:
    quiet = SCRIPT.replace('asyncio.run(app.crash(RuntimeError("fenced")))', "").replace("time.sleep(60)", "time.sleep(1.5)")
    done = subprocess.run([sys.executable, "-c", quiet], cwd=ROOT, capture_output=True, text=True, timeout=50, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "still alive"), done.stderr
