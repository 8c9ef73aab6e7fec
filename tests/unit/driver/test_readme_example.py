"""The README's flows module and its driver test run as a user's project would: public names only, nothing patched."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: The README's code blocks, by the comment on their first line.
FLOWS_BLOCK = "# myapp/flows.py"
TEST_BLOCK = "# tests/test_myapp_flows.py"


def _blocks() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    found: dict[str, str] = {}
    for chunk in text.split("```python\n")[1:]:
        code = chunk.split("```", 1)[0]
        first = code.split("\n", 1)[0]
        if first in (FLOWS_BLOCK, TEST_BLOCK):
            found[first] = code
    return found


def _weir_names(code: str) -> list[str]:
    """Every name the code imports from weir's packages, as ``module:name``."""
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("weir", "app", "agents", "tables"):
            names += [f"{node.module}:{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.split(".")[0] in ("weir", "app", "agents", "tables")]
    return names


def test_the_readme_has_both_blocks() -> None:
    assert set(_blocks()) == {FLOWS_BLOCK, TEST_BLOCK}


@pytest.mark.parametrize("block", [FLOWS_BLOCK, TEST_BLOCK])
def test_the_readme_example_imports_only_weirs_public_names(block: str) -> None:
    code = _blocks()[block]
    imported = _weir_names(code)
    assert imported, "the example imports weir"
    private = [name for name in imported if not name.startswith("weir:") or name.split(":")[1].startswith("_")]
    assert not private, f"the README's example imports {private}: only `from weir import <public name>`"
    import weir

    assert all(name.split(":")[1] in weir.__all__ for name in imported)
    assert "monkeypatch" not in code
    assert "mock" not in code


def test_the_readme_example_passes_as_a_users_project(tmp_path: Path) -> None:
    blocks = _blocks()
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "flows.py").write_text(blocks[FLOWS_BLOCK])
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_myapp_flows.py").write_text(blocks[TEST_BLOCK])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "tests"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout
