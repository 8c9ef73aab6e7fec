"""Starting and stopping `faust -A app.main worker` processes (demos, benchmarks, tests)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn

from weir.app.edge import command_edge

__all__ = [
    "WorkerProcess",
    "Supervisor",
    "announce_restart",
    "start_workers",
    "supervised",
    "stop_all",
    "run_main",
    "terminate",
    "Terminated",
]

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class WorkerProcess:
    """One worker running the agents ``agents`` with ``env``; its output goes to ``log_path``.

    ``entry`` is the worker's entry module (``faust -A <entry> worker``): ``app.main``, or that of a package built on
    weir that builds its own :class:`app.application.Application` with agent sets of its own. ``web_host``: the host
    name the worker advertises to its peers (``--web-host``); it binds to ``WEIR_WEB_HOST`` (127.0.0.1 by default).
    """

    agents: str
    env: dict[str, str]
    log_path: Path
    web_port: int
    entry: str = "app.main"
    web_host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> WorkerProcess:
        faust = Path(sys.executable).parent / "faust"
        command = [str(faust), "-A", self.entry, "worker", "-l", "info", "--web-host", self.web_host, "--web-port", str(self.web_port)]
        env = {"PYTHONPATH": str(ROOT), **self.env, "WEIR_AGENTS": self.agents, "WEIR_WEB_PORT": str(self.web_port)}
        if self._log is not None:  # started again (Supervisor): the log goes on in the same file
            self._log.close()
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


#: The exit code of a worker that refused its settings or arguments (app.edge.command_edge): not restarted.
REFUSED_EXIT = 2


class Supervisor:
    """Restarts a worker that exits on its own, in its slot, as a service manager would (systemd's
    ``Restart=on-failure``, compose's ``restart: unless-stopped``): for the demos, the benchmarks and the tests.

    A worker stops itself when going on could commit wrong work: its producer fenced (the broker aborted its
    transaction after an outage longer than the transaction timeout), a store ahead of its changelog, an error
    that escaped an agent's loop. Restarted on its web port, it keeps its transactional id and static-membership id
    (``<host>-<port>``), ends what its predecessor left open and restores its tables from the committed changelog;
    nothing is lost or repeated. An exit with code 2 (:data:`REFUSED_EXIT`: a setting or argument the worker
    refused) is not restarted: it would refuse again. Restarts back off, from ``backoff_s`` doubling to
    ``max_backoff_s``; a worker that stayed up ``steady_s`` starts from ``backoff_s`` again.
    """

    def __init__(
        self,
        workers: Iterable[WorkerProcess],
        *,
        on_restart: Callable[[WorkerProcess, int], None] | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        steady_s: float = 60.0,
        poll_s: float = 0.2,
    ) -> None:
        self.workers = list(workers)
        self.on_restart = on_restart
        self.backoff_s, self.max_backoff_s, self.steady_s, self.poll_s = backoff_s, max_backoff_s, steady_s, poll_s
        #: (the worker's agents, its web port, the exit code) of each restart, in order
        self.restarts: list[tuple[str, int, int]] = []
        #: workers that exited with :data:`REFUSED_EXIT`, left stopped
        self.refused: list[WorkerProcess] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._watch, name="weir-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Restart nothing more (call before stopping the workers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _watch(self) -> None:
        started = {id(worker): time.monotonic() for worker in self.workers}
        delay = {id(worker): self.backoff_s for worker in self.workers}
        due: dict[int, float] = {}  # a worker that exited: when it starts again
        while not self._stop.wait(self.poll_s):
            for worker in self.workers:
                key = id(worker)
                code = worker.process.poll() if worker.process is not None else None
                if code is None or worker in self.refused:
                    continue
                if code == REFUSED_EXIT:
                    self.refused.append(worker)
                    continue
                now = time.monotonic()
                if key not in due:
                    if now - started[key] >= self.steady_s:
                        delay[key] = self.backoff_s
                    due[key] = now + delay[key]
                    delay[key] = min(delay[key] * 2, self.max_backoff_s)
                if now < due[key] or self._stop.is_set():
                    continue
                del due[key]
                self.restarts.append((worker.agents, worker.web_port, code))
                worker.start()
                started[key] = time.monotonic()
                if self.on_restart is not None:
                    self.on_restart(worker, code)


def announce_restart(worker: WorkerProcess, code: int) -> None:
    """A demo's line for a restart (:class:`Supervisor`'s ``on_restart``)."""
    print(f"  worker {worker.agents} (web port {worker.web_port}) exited with code {code}: restarted in its slot, log {worker.log_path}")


def stop_all(workers: Iterable[WorkerProcess]) -> None:
    """Stop workers at once: each gets its SIGTERM first, then each is waited for (one by one, a shutdown each)."""
    workers = list(workers)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.stop()


def start_workers(
    stages: Sequence[str], env: dict[str, str], log_dir: Path, first_port: int, *, entry: str = "app.main"
) -> list[WorkerProcess]:
    """A demo's workers, one per stage (its agents): worker N on web port ``first_port`` + N, its tables in
    ``log_dir/data-N`` and its output in ``log_dir/worker-N.log``; a line printed for each."""
    workers = []
    for number, agents in enumerate(stages):
        worker_env = {**env, "WEIR_DATA_DIR": str(log_dir / f"data-{number}")}
        worker = WorkerProcess(agents, worker_env, log_dir / f"worker-{number}.log", web_port=first_port + number, entry=entry).start()
        workers.append(worker)
        print(f"  worker {number}: {agents:<41} web http://127.0.0.1:{worker.web_port}/weir/  log {worker.log_path}")
    return workers


@contextlib.asynccontextmanager
async def supervised(workers: Sequence[WorkerProcess], *, ready_timeout_s: float = 120.0) -> AsyncIterator[Supervisor]:
    """Started workers, once every one is ready, under a :class:`Supervisor` (a worker that stops itself, its producer
    fenced after a broker outage say, is restarted in its slot); on the way out the supervisor and every worker stop."""
    supervisor = Supervisor(workers, on_restart=announce_restart)
    try:
        for worker in workers:
            await asyncio.to_thread(worker.wait_ready, ready_timeout_s)
        supervisor.start()
        yield supervisor
    finally:
        supervisor.stop()
        stop_all(workers)


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
