"""What a person running the demos meets before any worker starts: the broker's address, the orders folder, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shop.demo import print_latency, read_screens
from shop.screens import ScreenProgress, latency_ms
from shop.settings import demo_web_port
from tests.conftest import ROOT
from weir.app.settings import default_bootstrap


def test_the_bootstrap_follows_kafka_bootstrap_else_the_local_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("WEIR_KAFKA_PORT", raising=False)
    assert default_bootstrap() == "127.0.0.1:19092"
    monkeypatch.setenv("WEIR_KAFKA_PORT", "39092")
    assert default_bootstrap() == "127.0.0.1:39092", "the clients follow the port the broker script uses"
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "kafka:9092")
    assert default_bootstrap() == "kafka:9092"


def test_a_bad_orders_folder_is_named_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FileNotFoundError, match="no such folder"):
        read_screens(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match=r"no \*\.jsonl order files"):
        read_screens(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"order_id": "1"}\n')
    (tmp_path / "notes.txt").write_text("hello")
    assert read_screens(tmp_path) == {"a": ['{"order_id": "1"}']}
    assert "skipping notes.txt" in capsys.readouterr().err


def test_sigterm_stops_a_demo_the_way_ctrl_c_does(tmp_path: Path) -> None:
    """run_main: the coroutine's ``finally`` (which stops the workers) runs, and the exit status says SIGTERM."""
    marker = tmp_path / "stopped"
    script = (
        "import asyncio, sys\n"
        "from app.processes import run_main\n"
        "async def main() -> int:\n"
        "    try:\n"
        "        print('ready', flush=True)\n"
        "        await asyncio.sleep(60)\n"
        "        return 0\n"
        "    finally:\n"
        f"        open({str(marker)!r}, 'w').write('workers stopped')\n"
        "run_main(main())\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 143
    assert marker.read_text() == "workers stopped"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("command", ["shop.demo", "examples.split_aggregate"])
def test_a_broker_that_cannot_be_reached_is_one_line_naming_the_address_and_the_setting(command: str) -> None:
    bootstrap = f"127.0.0.1:{_free_port()}"  # nothing listens there
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"cannot reach the Kafka broker at {bootstrap}" in lines[0]
    assert "connection refused" in lines[0]
    assert "KAFKA_BOOTSTRAP" in lines[0]


def test_the_demos_first_web_port_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEIR_DEMO_WEB_PORT", raising=False)
    assert demo_web_port() == 6066
    monkeypatch.setenv("WEIR_DEMO_WEB_PORT", "7100")
    assert demo_web_port() == 7100
    monkeypatch.setenv("WEIR_DEMO_WEB_PORT", "70000")
    with pytest.raises(ValueError, match="WEIR_DEMO_WEB_PORT=70000"):
        demo_web_port()


def test_the_per_order_latency_is_a_nearest_rank_percentile_of_each_screen_and_of_all(capsys: pytest.CaptureFixture[str]) -> None:
    fast = ScreenProgress("fast", 4, latencies_s=[0.010, 0.020, 0.030, 0.040])
    slow = ScreenProgress("slow", 1, latencies_s=[1.5])
    assert (fast.latency_ms(0.5), fast.latency_ms(0.99)) == (pytest.approx(20.0), pytest.approx(40.0))
    assert latency_ms([], 0.5) is None
    print_latency({"fast": fast, "slow": slow, "idle": ScreenProgress("idle", 0)})
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        "  fast       p50     20 ms  p99     40 ms  (4 lines)",
        "  slow       p50  1,500 ms  p99  1,500 ms  (1 lines)",
        "  idle       p50         -  p99         -  (0 lines)",
        "  all        p50     30 ms  p99  1,500 ms  (5 lines)",
    ]
