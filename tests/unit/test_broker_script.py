"""scripts/broker.sh says what to install when Java or Maven is missing, before doing anything else."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "broker.sh"
TOOLS = ("bash", "mkdir", "dirname", "cat", "sed", "head", "kill", "sleep", "rm", "touch", "tail", "seq", "grep")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(tmp_path: Path, command: str, provided: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """Run the script with a PATH holding only basic tools plus ``provided``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in (*TOOLS, *provided):
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is needed to run this test")
        (bin_dir / tool).symlink_to(found)
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "WEIR_STATE_DIR": str(tmp_path / "state"),
        "WEIR_KAFKA_PORT": str(_free_port()),
        "WEIR_KAFKA_CONTROLLER_PORT": str(_free_port()),
    }
    env.pop("KAFKA_BOOTSTRAP", None)
    return subprocess.run([str(bin_dir / "bash"), str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=60, check=False)


def test_missing_java_names_what_to_install(tmp_path: Path) -> None:
    result = _run(tmp_path, "start", provided=("mvn",))
    assert result.returncode != 0
    assert "Java 17 or newer is required" in result.stderr
    assert "openjdk-17" in result.stderr
    assert "KAFKA_BOOTSTRAP" in result.stderr


def test_missing_maven_names_what_to_install(tmp_path: Path) -> None:
    result = _run(tmp_path, "jars", provided=("java",))
    assert result.returncode != 0
    assert "Maven (mvn) is required" in result.stderr
    assert "apt-get install maven" in result.stderr


def test_external_broker_is_used_as_is(tmp_path: Path) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1", "WEIR_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0
    assert "using that broker" in result.stdout
    assert not (tmp_path / "state" / "kafka-data").exists()
