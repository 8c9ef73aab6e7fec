"""Every command reports a bad setting, argument or broker in one line on stderr with exit code 2, no traceback.

Each case runs the command as a user types it, in a process of its own (no broker: each is refused before one is
needed, or names an address where none listens).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FAUST = str(Path(sys.executable).with_name("faust"))

CASES = [
    # (command, environment, what the one line says)
    ([FAUST, "-A", "app.main", "worker"], {"WEIR_PARTITIONS": "abc"}, "weir worker: setting WEIR_PARTITIONS='abc': expected an integer"),
    ([FAUST, "-A", "app.main", "worker"], {"WEIR_MAX_MESSAGE_BYTES": "-1"}, "setting WEIR_MAX_MESSAGE_BYTES='-1': must be at least"),
    ([FAUST, "-A", "app.main", "worker"], {"WEIR_AGENTS": "nope"}, "unknown agent set(s) ['nope']"),
    ([FAUST, "-A", "app.main", "worker"], {"WEIR_EVENT_LOOP": "trio"}, "setting WEIR_EVENT_LOOP='trio': expected 'uvloop' or 'asyncio'"),
    ([FAUST, "-A", "app.main", "worker"], {"WEIR_AGENTS": "flows", "WEIR_FLOWS": "no.such.module"}, "cannot import 'no.such.module'"),
    ([FAUST, "-A", "shop.main", "worker"], {"WEIR_SHOP_STOCK_OVERRIDES": "mint=x"}, "shop worker: setting WEIR_SHOP_STOCK_OVERRIDES"),
    (
        [sys.executable, "-m", "app.outbox_relay", "--help"],
        {"WEIR_PARTITIONS": "abc"},
        "python -m app.outbox_relay: setting WEIR_PARTITIONS",
    ),
    (
        [sys.executable, "-m", "app.outbox_relay", "--db", "postgresql://weir:s3cret@127.0.0.1:1/weir"],
        {},
        "cannot open the outbox 'postgresql://weir:***@127.0.0.1:1/weir' (--db, WEIR_OUTBOX_DB)",
    ),
    ([sys.executable, "-m", "app.outbox_relay", "--db", "/no/such/dir/outbox.db"], {}, "cannot open the outbox '/no/such/dir/outbox.db'"),
    ([sys.executable, "-m", "app.eof_gateway", "no-such-client.jsonl"], {}, "python -m app.eof_gateway: [Errno 2] No such file"),
    ([sys.executable, "-m", "app.eof_gateway", "x.jsonl"], {"WEIR_EOF_IDLE_TIMEOUT_MS": "soon"}, "WEIR_EOF_IDLE_TIMEOUT_MS='soon'"),
    (
        [sys.executable, "-m", "app.control", "force", "complete", "--topic", "t.item-results", "--bootstrap", "127.0.0.1:1"],
        {},
        "python -m app.control: cannot reach the Kafka broker at 127.0.0.1:1 (127.0.0.1:1: connection refused)",
    ),
    (
        [sys.executable, "-m", "app.control", "force", "complete", "--topic", "t", "--bootstrap", "bad::host:zz"],
        {},
        "cannot reach the Kafka broker at bad::host:zz",
    ),
    (
        [sys.executable, "-m", "app.control", "force", "complete", "--topic", "t", "--bootstrap", "no-such-host.invalid:9092"],
        {},
        "cannot reach the Kafka broker at no-such-host.invalid:9092",
    ),
    ([sys.executable, "-m", "shop.demo"], {"WEIR_PARTITIONS": "0"}, "weir: setting WEIR_PARTITIONS='0': must be at least 1"),
    # an argument refused: argparse's usage lines are not printed, only the error (app.edge.CommandParser)
    *[
        ([sys.executable, "-m", module.split()[0], *arguments], {}, f"python -m {module}: {message}")
        for module, arguments, message in [
            ("app.control force", ["force", "complete", "--topic", "t", "-l", "loud"], "argument --log-level/-l: invalid choice: 'loud'"),
            ("app.control", ["nothing"], "argument command: invalid choice: 'nothing'"),
            ("app.outbox_relay", ["--bogus"], "unrecognized arguments: --bogus"),
            ("app.eof_gateway", [], "the following arguments are required: files"),
            ("shop.demo", ["--bogus"], "unrecognized arguments: --bogus"),
            ("examples.eof_tasks", ["--bogus"], "unrecognized arguments: --bogus"),
            ("examples.split_aggregate", ["--bogus"], "unrecognized arguments: --bogus"),
        ]
    ],
    ([sys.executable, "-m", "examples.split_aggregate"], {"WEIR_GUARANTEE": "maybe"}, "weir: setting WEIR_GUARANTEE='maybe'"),
]


@pytest.mark.parametrize(("command", "env", "line"), CASES, ids=[f"{case[0][-1]}-{next(iter(case[1]), 'arg')}" for case in CASES])
def test_a_command_refuses_in_one_line(command: list[str], env: dict[str, str], line: str) -> None:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WEIR_")}
    environment.update(env, KAFKA_BOOTSTRAP="127.0.0.1:1")
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert line in lines[0]


@pytest.mark.parametrize("module", ["app.control", "app.outbox_relay", "app.eof_gateway"])
def test_every_command_takes_a_log_level(module: str) -> None:
    """``--log-level`` (``-l``) on every command (the worker's is Faust's own ``-l``); a level it does not know is refused
    in one line (above)."""
    command = [sys.executable, "-m", module, *(["force", "--help"] if module == "app.control" else ["--help"])]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--log-level {debug,info,warning,error,critical}, -l {" in done.stdout, done.stdout
