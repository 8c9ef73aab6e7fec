"""A second, private instance of the project's local Kafka (scripts/broker.sh) for tests that need their own broker.

The shared broker (127.0.0.1:19092, or KAFKA_BOOTSTRAP) is never touched: an instance has its own ports and
its own WEIR_STATE_DIR (data, pid file, config), and shares only the jars already fetched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import ROOT
from tests.integration.conftest import free_port

SHARED_LIBS = ROOT / ".weir" / "kafka" / "libs"


@dataclass
class BrokerInstance:
    """One broker started with scripts/broker.sh under its own state dir and ports."""

    state_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "KAFKA_BOOTSTRAP" and not key.startswith("WEIR_KAFKA_")}
        env.update(
            {
                "WEIR_STATE_DIR": str(self.state_dir),
                "WEIR_KAFKA_PORT": str(self.port),
                "WEIR_KAFKA_CONTROLLER_PORT": str(self.controller_port),
                "WEIR_KAFKA_READY_TIMEOUT": "120",
            }
        )
        if (SHARED_LIBS / ".complete").exists():
            env["WEIR_KAFKA_LIBS"] = str(SHARED_LIBS)
        env.update(self.extra_env)
        return env

    def run(self, command: str) -> str:
        result = subprocess.run([str(ROOT / "scripts" / "broker.sh"), command], env=self.env(), capture_output=True, text=True, timeout=180)
        if result.returncode != 0 and command != "status":
            message = f"scripts/broker.sh {command} for {self.state_dir} failed:\n{result.stdout}\n{result.stderr}"
            raise RuntimeError(message)
        return result.stdout

    def start(self) -> BrokerInstance:
        self.run("start")
        return self

    def stop(self) -> None:
        self.run("stop")

    def kill(self) -> None:
        """SIGKILL the broker (no shutdown: open transactions, unflushed segments and the controller's state as they
        are); :meth:`start` brings it back on the same data directory."""
        pidfile = self.state_dir / "kafka.pid"
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        pidfile.unlink(missing_ok=True)

    def server_log(self) -> str:
        path = self.state_dir / "kafka" / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""
