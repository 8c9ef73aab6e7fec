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
#: The JVM options of a test's own broker unless WEIR_TEST_KAFKA_JVM_OPTS says otherwise (the Makefile sets it to the
#: same): C1 only and the serial collector, which cost a broker living for minutes a third less CPU (the three-broker
#: test: 181 CPU-seconds instead of 260).
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


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
                "WEIR_KAFKA_JVM_OPTS": os.environ.get("WEIR_TEST_KAFKA_JVM_OPTS", TEST_JVM_OPTS),
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


@dataclass
class ClusterInstance:
    """A cluster of ``nodes`` KRaft nodes (each broker and controller) started with scripts/broker.sh
    (``WEIR_KAFKA_NODES``) under its own state dir and ports: replication 3, ``min.insync.replicas`` 2."""

    state_dir: Path
    nodes: int = 3
    ports: list[int] = field(default_factory=list)
    controller_ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = self.ports or [free_port() for _ in range(self.nodes)]
        self.controller_ports = self.controller_ports or [free_port() for _ in range(self.nodes)]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def env(self) -> dict[str, str]:
        env = BrokerInstance(self.state_dir, port=self.ports[0], controller_port=self.controller_ports[0]).env()
        env.update(
            {
                "WEIR_KAFKA_NODES": str(self.nodes),
                "WEIR_KAFKA_PORTS": ",".join(map(str, self.ports)),
                "WEIR_KAFKA_CONTROLLER_PORTS": ",".join(map(str, self.controller_ports)),
            }
        )
        return env

    def run(self, *command: str) -> str:
        script = str(ROOT / "scripts" / "broker.sh")
        result = subprocess.run([script, *command], env=self.env(), capture_output=True, text=True, timeout=180)
        if result.returncode != 0 and command[0] != "status":
            message = f"scripts/broker.sh {' '.join(command)} for {self.state_dir} failed:\n{result.stdout}\n{result.stderr}"
            raise RuntimeError(message)
        return result.stdout

    def start(self) -> ClusterInstance:
        self.run("start")
        return self

    def stop(self) -> None:
        self.run("stop")

    def kill(self) -> None:
        """SIGKILL every node (a test's cluster is thrown away: no need for three orderly shutdowns)."""
        for node in range(1, self.nodes + 1):
            self.kill_node(node)

    def kill_node(self, node: int) -> None:
        """SIGKILL node ``node`` (1-based): no shutdown, no leadership handed over."""
        self.run("kill-node", str(node))

    def start_node(self, node: int) -> None:
        """Start node ``node`` again on its data directory; returns once it serves clients."""
        self.run("start-node", str(node))

    def server_log(self, node: int) -> str:
        path = self.state_dir / f"kafka-{node}" / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def active_controller(self) -> int:
        """The node that last became the quorum's leader (the active controller), from the nodes' logs."""
        latest: dict[int, str] = {}
        for node in range(1, self.nodes + 1):
            stamps = [line[1:24] for line in self.server_log(node).splitlines() if "Completed transition to Leader" in line]
            if stamps:
                latest[node] = stamps[-1]
        assert latest, "no node has led the quorum yet"
        return max(latest, key=lambda node: latest[node])
