"""docker/compose.yaml's shop, relay and screens, run outside Docker with the commands and environments the file gives.

No Docker engine runs on the development machines, so the compose file's own services are started here as processes:
each shop worker with its service's command and environment (the broker, topic prefix, data folder, database and
ports swapped for the test's: its ports keep their order, shifted into a free block), the outbox relay, then the order
screens' command. What only this shows: every worker advertises its service name and a port of its own (the table views
route a key to the worker whose advertised address owns it: with one address for all, a worker takes the others for
itself), the screens service serves a day against workers it did not start, and the relay serves its metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import free_port_block
from weir.app.kafka_io import delete_topics
from weir.app.processes import WorkerProcess, stop_all

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("shop")]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
#: The first web port of the compose file; a service's port p runs here on base + (p - FIRST_PORT).
FIRST_PORT = 6066
LINES_PER_SCREEN = 12


def services() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]
    return loaded


def outside_docker(
    name: str, service: dict[str, Any], swaps: dict[str, str], base_port: int, orders: Path
) -> tuple[list[str], dict[str, str]]:
    """The service's command and environment as a process here: the test's broker, prefix, data folder and database,
    its ports in the test's block, servers on 127.0.0.1, the image's paths as the checkout's."""
    env = {**os.environ, **{key: str(value) for key, value in service.get("environment", {}).items()}, **swaps}
    env["WEIR_DATA_DIR"] = str(Path(swaps["WEIR_DATA_DIR"]) / name)
    env["PYTHONPATH"] = str(ROOT)

    def shifted(port: str) -> str:
        return str(int(port) - FIRST_PORT + base_port)

    if "WEIR_WEB_PORT" in env and "WEIR_WEB_PORT" in service.get("environment", {}):
        env["WEIR_WEB_PORT"] = shifted(env["WEIR_WEB_PORT"])
    command = [str(word) for word in service["command"]]
    for flag in ("--web-port", "--metrics-port"):
        if flag in command:
            command[command.index(flag) + 1] = shifted(command[command.index(flag) + 1])
    if "--metrics-host" in command:
        command[command.index("--metrics-host") + 1] = "127.0.0.1"
    if "--orders" in command:
        command[command.index("--orders") + 1] = str(orders)
    command[0] = (
        str(Path(sys.executable).parent / "faust") if command[0] == "faust" else sys.executable if command[0] == "python" else command[0]
    )
    return command, env


def index_of(port: int) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/weir/", headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_the_compose_files_shop_relay_and_screens_run_a_day_each_worker_at_its_own_address(
    kafka_bootstrap: str, postgres_schema: Any, tmp_path: Path
) -> None:
    defined = services()
    shop_workers = {
        name: service for name, service in defined.items() if name.startswith("shop_") and "WEIR_AGENTS" in service["environment"]
    }
    assert len(shop_workers) == 8
    orders = tmp_path / "orders"
    orders.mkdir()
    for screen in sorted((ROOT / "demo" / "shop").glob("*.jsonl")):
        lines = screen.read_text(encoding="utf-8").splitlines()[:LINES_PER_SCREEN]
        (orders / screen.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = uuid.uuid4().hex[:8]
    swaps = {
        "KAFKA_BOOTSTRAP": kafka_bootstrap,
        "WEIR_TOPIC_PREFIX": f"compose-{run}.",
        "WEIR_APP_ID": f"compose-{run}",
        "WEIR_DATA_DIR": str(tmp_path / "data"),
        "WEIR_WEB_HOST": "127.0.0.1",
        "WEIR_OUTBOX_DB": postgres_schema(),
        "WEIR_SESSION_TIMEOUT": "6",
        "WEIR_HEARTBEAT_INTERVAL": "0.5",
    }
    base_port = free_port_block(20)
    workers: list[WorkerProcess] = []
    relay: subprocess.Popen[bytes] | None = None
    try:
        for name, service in shop_workers.items():
            command, env = outside_docker(name, service, swaps, base_port, orders)
            assert command[command.index("--web-host") + 1] == name, "the compose file's command advertises the service's name"
            port = int(command[command.index("--web-port") + 1])
            entry = command[command.index("-A") + 1]
            worker = WorkerProcess(env["WEIR_AGENTS"], env, tmp_path / f"{name}.log", web_port=port, entry=entry, web_host=name)
            workers.append(worker.start())
        relay_command, relay_env = outside_docker("outbox_relay", defined["outbox_relay"], swaps, base_port, orders)
        with (tmp_path / "relay.log").open("wb") as relay_log:
            relay = subprocess.Popen(relay_command, cwd=ROOT, env=relay_env, stdout=relay_log, stderr=subprocess.STDOUT)
        for worker in workers:
            worker.wait_ready(120)

        # Every worker advertises http://<service>:<port>, and finds the other payment worker at its own address.
        names = dict(zip((worker.web_port for worker in workers), shop_workers, strict=True))
        for port, name in names.items():
            assert index_of(port)["worker"] == f"http://{name}:{port}"
        payments = {port: name for port, name in names.items() if name.startswith("shop_payments_")}
        deadline = time.monotonic() + 60
        seen: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            seen = {name: index_of(port)["workers"] for port, name in payments.items()}
            if all(len(urls) == 2 for urls in seen.values()):
                break
            time.sleep(1)
        expected = sorted(f"http://{name}:{port}" for port, name in payments.items())
        assert all(sorted(urls) == expected for urls in seen.values()), f"each payment worker sees both addresses: {seen}"

        # The screens service: a day against the workers it did not start.
        screens_command, screens_env = outside_docker("shop_screens", defined["shop_screens"], swaps, base_port, orders)
        done = subprocess.run(screens_command, cwd=ROOT, env=screens_env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, f"the screens service failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        for screen in ("screen-1", "screen-2", "screen-3"):
            assert screen in done.stdout
        assert ": ok" in done.stdout, done.stdout[-2000:]
        assert "MISMATCH" not in done.stdout
        assert "UNBALANCED" not in done.stdout

        # The relay's metrics, on its port.
        relay_port = int(relay_command[relay_command.index("--metrics-port") + 1])
        with urllib.request.urlopen(f"http://127.0.0.1:{relay_port}/metrics", timeout=5) as response:
            assert response.status == 200
            assert b"weir_outbox" in response.read()
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(30)
        stop_all(workers)
        if not os.environ.get("WEIR_KEEP_TEST_TOPICS"):
            import asyncio

            asyncio.run(delete_topics(kafka_bootstrap, f"compose-{run}"))
