"""Importing weir's public API does no work: no Faust application, no setting read, no worker module."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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
    "app/windows.py",
    "app/runtime/keyed.py",
    "app/runtime/environment.py",
    "weir/__init__.py",
]


@pytest.mark.parametrize("path", LIBRARY)
def test_a_library_module_does_not_import_the_worker(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    worker = sorted(
        name for name in imported if name.removeprefix("weir.") == "app.main" or name.removeprefix("weir.").startswith("agents")
    )
    assert not worker, f"{path} imports {worker}: the worker is built on the library, not the other way"


def test_importing_weir_builds_no_faust_app_and_reads_no_setting() -> None:
    # A setting the worker would refuse at import: importing weir must not read it.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WEIR_PARTITIONS": "not a number", "WEIR_AGENTS": "nonsense"}
    code = (
        "import gc, sys, faust, weir\n"
        "worker = lambda name: name == 'app.main' or name.startswith('agents')\n"
        "loaded = sorted(name for name in sys.modules if worker(name.removeprefix('weir.')))\n"
        "assert not loaded, loaded\n"
        "assert not [o for o in gc.get_objects() if isinstance(o, faust.App)], 'a Faust app was built'\n"
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
        [sys.executable, "-c", "import app.main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
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


def test_a_project_with_its_own_app_package_installs_and_uses_weir(tmp_path: Path) -> None:
    """The wheel holds one top-level package, ``weir`` (its worker, agents and tables as ``weir.app``, ``weir.agents``,
    ``weir.tables``): installed beside a project whose own package is ``app``, both import, and a flow runs."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("weir", "app", "agents", "tables"):  # weir/app links to app/: copied as links, as a checkout has them
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "wheels"), str(source)], check=True, timeout=300)
    (wheel,) = (tmp_path / "wheels").glob("weir-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"weir"}, f"the wheel installs {sorted(tops)}"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True, timeout=300)
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("MINE = True\n")
    # The project's own worker entry, as the README shows it: weir's flows agent and an agent set of its own.
    (project / "app" / "main.py").write_text(
        "from pathlib import Path\nfrom weir import Application, Flow, Settings\n"
        "from weir.app.stages import Stage\n"
        "async def nothing(part): pass\n"
        "def mine(application):\n"
        "    return [Stage('mine', (application.topic(application.settings.topic('mine-in')),), nothing)]\n"
        f"settings = Settings(agents=('flows', 'mine'), app_id='project', data_dir=Path({str(tmp_path / 'data')!r}))\n"
        "application = Application(settings, flows=[Flow('f', source='in').to('out')], agent_sets={'mine': mine})\n"
        "app = application.serve_agents()\n"
    )
    code = (
        "import sys, app, weir\n"
        "assert app.MINE, 'the project imports its own app'\n"
        "with weir.TestDriver([weir.Flow('f', source='in').to('out')]) as driver:\n"
        "    driver.pipe('in', {'n': 1})\n"
        "    assert driver.values('out') == [{'n': 1}]\n"
        "import app.main\n"
        "assert sorted(app.main.app.agents) == ['flow-f', 'mine'], sorted(app.main.app.agents)\n"
        "print(weir.__file__, sorted(name for name in sys.modules if name.split('.')[0] in ('app', 'agents', 'tables')))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{project}"}
    run = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    where, short_names = run.stdout.split(" ", 1)
    assert where.startswith(str(tmp_path / "site")), f"weir came from {where}, not the installed wheel"
    assert short_names.strip() == "['app', 'app.main']", f"only the project's app is imported by its short name: {short_names}"


def test_the_checkouts_short_names_are_the_same_modules_as_weirs() -> None:
    """From the repository, ``app.x`` is ``weir.app.x`` itself (``faust -A app.main``, ``python -m app.outbox_relay``)."""
    code = (
        "import importlib, sys\n"
        "import app.settings, agents, tables.eof\n"
        "import weir.app.settings, weir.tables.eof\n"
        "assert app.settings is weir.app.settings and tables.eof is weir.tables.eof\n"
        "assert sys.modules['agents'] is importlib.import_module('weir.agents')\n"
        "assert app.settings.__spec__.name == 'weir.app.settings', app.settings.__spec__\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.stdout.strip() == "ok", run.stderr[-3000:]
    relay = subprocess.run(
        [sys.executable, "-m", "app.outbox_relay", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert relay.returncode == 0, relay.stderr[-3000:]
    assert "--topic" in relay.stdout
