"""The Supervisor restarts a worker that exits on its own, in its slot, and leaves alone one that refused its
settings (exit code 2) or that exits after the supervisor stopped. Real processes; the worker's command is a small
Python script instead of ``faust ... worker`` (what the worker does is not the point here)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from weir.app.processes import Supervisor, WorkerProcess

#: Exits with the code at the position of its run (counted in a file), and stays up once the codes run out.
SCRIPT = """
import sys, time, pathlib
runs = pathlib.Path(sys.argv[1]); codes = [int(code) for code in sys.argv[2].split(",") if code]
run = int(runs.read_text()) if runs.exists() else 0
(runs.parent / (runs.name + ".new")).write_text(str(run + 1))
(runs.parent / (runs.name + ".new")).replace(runs)  # whole, never half-written: the test reads it meanwhile
if run < len(codes):
    sys.exit(codes[run])
time.sleep(60)
"""


@dataclass
class ScriptWorker(WorkerProcess):
    codes: str = ""

    def start(self) -> ScriptWorker:
        runs = self.log_path.with_suffix(".runs")
        self.process = subprocess.Popen([sys.executable, "-c", SCRIPT, str(runs), self.codes], start_new_session=True)
        return self

    def runs(self) -> int:
        path = self.log_path.with_suffix(".runs")
        return int(path.read_text()) if path.exists() else 0


def wait_until(condition: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.02)


def worker(tmp_path: Path, name: str, codes: str, port: int) -> ScriptWorker:
    return ScriptWorker(name, {}, tmp_path / f"{name}.log", web_port=port, codes=codes).start()


def test_a_worker_that_exits_is_restarted_in_its_slot_until_it_stays_up(tmp_path: Path) -> None:
    crashing = worker(tmp_path, "kitchen", "1,1,3", 7001)
    steady = worker(tmp_path, "payments", "", 7002)
    seen: list[tuple[int, int]] = []
    with Supervisor(
        [crashing, steady], backoff_s=0.05, poll_s=0.01, on_restart=lambda w, code: seen.append((w.web_port, code))
    ) as supervisor:
        wait_until(lambda: crashing.runs() == 4 and crashing.process is not None and crashing.process.poll() is None)
        time.sleep(0.2)  # and no further restart once it stays up
    assert supervisor.restarts == [("kitchen", 7001, 1), ("kitchen", 7001, 1), ("kitchen", 7001, 3)]
    assert seen == [(7001, 1), (7001, 1), (7001, 3)]
    assert crashing.runs() == 4
    assert steady.runs() == 1
    for process in (crashing.process, steady.process):
        assert process is not None
        assert process.poll() is None
        process.kill()
        process.wait()


def test_a_worker_that_refused_its_settings_is_not_restarted(tmp_path: Path) -> None:
    refusing = worker(tmp_path, "flows", "2", 7003)
    with Supervisor([refusing], backoff_s=0.01, poll_s=0.01) as supervisor:
        wait_until(lambda: supervisor.refused == [refusing])
        time.sleep(0.1)
    assert (supervisor.restarts, refusing.runs()) == ([], 1)


def test_restarts_back_off_and_nothing_restarts_after_stop(tmp_path: Path) -> None:
    crashing = worker(tmp_path, "items", "1,1,1,1,1,1,1,1", 7004)
    supervisor = Supervisor([crashing], backoff_s=0.05, max_backoff_s=0.2, poll_s=0.01).start()
    started = time.monotonic()
    wait_until(lambda: len(supervisor.restarts) >= 4)
    # 0.05 + 0.1 + 0.2 + 0.2 s of backoff at least before the fourth restart (doubling, capped)
    assert time.monotonic() - started >= 0.55
    supervisor.stop()
    restarts = len(supervisor.restarts)
    assert crashing.process is not None
    crashing.process.wait(10)
    time.sleep(0.3)
    assert len(supervisor.restarts) == restarts
    assert crashing.process.poll() is not None
