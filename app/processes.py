"""Starting and stopping `faust -A app.main worker` processes (demos, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

from weir.app.edge import command_edge

__all__ = ["WorkerProcess", "stop_all", "run_main", "terminate", "Terminated"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class WorkerProcess:
    """One worker running the agents ``agents`` with ``env``; its output goes to ``log_path``.

    ``entry`` is the worker's entry module (``faust -A <entry> worker``): ``app.main``, or that of a package built on
    weir that builds its own :class:`app.application.Application` with agent sets of its own.
    """

    agents: str
    env: dict[str, str]
    log_path: Path
    web_port: int
    entry: str = "app.main"
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> WorkerProcess:
        faust = Path(sys.executable).parent / "faust"
        command = [str(faust), "-A", self.entry, "worker", "-l", "info", "--web-host", "127.0.0.1", "--web-port", str(self.web_port)]
        env = {"PYTHONPATH": str(ROOT), **self.env, "WEIR_AGENTS": self.agents, "WEIR_WEB_PORT": str(self.web_port)}
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Worker ready" in self.log_text():
                return
            if self.process is not None and self.process.poll() is not None:
                message = f"worker {self.agents} exited with {self.process.returncode} ({self.log_path}):\n{self.log_text()[-4000:]}"
                raise RuntimeError(message)
            time.sleep(0.2)
        message = f"worker {self.agents} not ready after {timeout_s}s ({self.log_path}):\n{self.log_text()[-4000:]}"
        raise RuntimeError(message)

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash looks like to the group and the broker."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def terminate(self) -> None:
        """SIGTERM: the worker begins its shutdown (:meth:`stop` waits for it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """Stop workers at once: each gets its SIGTERM first, then each is waited for (one by one, a shutdown each)."""
    workers = list(workers)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.stop()


class Terminated(KeyboardInterrupt):
    """SIGTERM (a ``timeout``, a CI runner, a container stop), handled as Ctrl-C is."""


def terminate(signum: int, frame: Any) -> None:
    """A SIGTERM handler: raise :class:`Terminated` where the main thread is, so ``finally`` blocks stop the workers."""
    raise Terminated


def run_main(main: Coroutine[Any, Any, int]) -> NoReturn:
    """Run a demo's coroutine and exit with its code; Ctrl-C (130) and SIGTERM (143) exit once its ``finally`` stopped the workers.

    A setting refused or a broker that cannot be used is one line on stderr and exit code 2, not a traceback
    (:func:`app.edge.command_edge`).
    """
    signal.signal(signal.SIGTERM, terminate)
    try:
        with command_edge():
            sys.exit(asyncio.run(main))
    except Terminated:
        print("\nterminated: workers stopped", flush=True)
        sys.exit(143)
    except KeyboardInterrupt:
        print("\ninterrupted: workers stopped", flush=True)
        sys.exit(130)
