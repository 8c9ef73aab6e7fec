"""Importing weir's public API does no work: no Faust application, no setting read, no worker module."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

#: The modules a stage's code and the test driver are made of: none may import the worker (app.core) or an agent.
LIBRARY = [
    "app/shell.py",
    "app/stages.py",
    "app/aggregation.py",
    "app/flow_topology.py",
    "app/eof_topology.py",
    "app/pipeline.py",
    "app/testing.py",
    "app/runtime/keyed.py",
    "app/runtime/environment.py",
    "weir/__init__.py",
]


@pytest.mark.parametrize("path", LIBRARY)
def test_a_library_module_does_not_import_the_worker(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    worker = sorted(name for name in imported if name in ("app.core", "app.main", "app.serve") or name.startswith("agents"))
    assert not worker, f"{path} imports {worker}: the worker is built on the library, not the other way"


def test_importing_weir_builds_no_faust_app_and_reads_no_setting() -> None:
    # A setting the worker would refuse at import: importing weir must not read it.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WEIR_PARTITIONS": "not a number", "WEIR_AGENTS": "nonsense"}
    code = (
        "import sys, weir\n"
        "loaded = sorted(name for name in sys.modules if name in ('app.core', 'app.main', 'app.serve') or name.startswith('agents'))\n"
        "assert not loaded, loaded\n"
        "with weir.TestDriver([weir.Flow('f', source='in').to('out')]) as driver:\n"
        "    driver.pipe('in', {'n': 1})\n"
        "    assert driver.values('out') == [{'n': 1}]\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "ok"


def test_the_worker_still_refuses_a_bad_setting_at_its_edge() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WEIR_PARTITIONS": "not a number"}
    run = subprocess.run(
        [sys.executable, "-c", "import app.core"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode != 0
    assert "WEIR_PARTITIONS='not a number': expected an integer" in run.stderr


def test_settings_from_the_environment_only_at_the_edge() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WEIR_PARTITIONS": "7", "WEIR_TOPIC_PREFIX": "edge."}
    code = (
        "from weir import Settings\n"
        "assert Settings().partitions == 4, 'a value: its documented defaults, whatever the environment says'\n"
        "edge = Settings.from_env()\n"
        "print(edge.partitions, edge.topic('x'))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["7", "edge.x"]
