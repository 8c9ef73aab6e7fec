"""Imports run one way: engine -> runtime -> patterns -> the shop and the web views (checked on the source, by ast)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: Modules of ``app/`` that are the demo's or the shop's, or sit on top of everything (the web views, the entry point).
TOP_OF_APP = ("app/shop_", "app/demo", "app/web.py", "app/main.py", "app/eof_gateway.py", "app/outbox_relay.py")


def _imports(path: Path) -> set[str]:
    """The weir modules ``path`` imports (absolute imports of app, agents and tables)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("app", "agents", "tables")}


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", _modules("app/engine"), ids=_relative)
def test_the_engine_imports_nothing_of_weir_but_itself(path: Path) -> None:
    outside = sorted(name for name in _imports(path) if not name.startswith("app.engine"))
    assert not outside, f"{_relative(path)} imports {outside}: the engine sits below everything"


@pytest.mark.parametrize("path", _modules("app/runtime"), ids=_relative)
def test_the_runtime_knows_no_pattern_no_shop_and_no_web_server(path: Path) -> None:
    upward = sorted(name for name in _imports(path) if name.startswith(("agents", "tables", "app.web", "app.shop")))
    assert not upward, f"{_relative(path)} imports {upward}"


@pytest.mark.parametrize("path", _modules("tables"), ids=_relative)
def test_pattern_cores_and_tables_import_no_agent_and_no_web_server(path: Path) -> None:
    upward = sorted(name for name in _imports(path) if name.startswith("agents") or name == "app.web")
    assert not upward, f"{_relative(path)} imports {upward} (views register through app.runtime.views)"


@pytest.mark.parametrize("path", [path for path in _modules("app") if not _relative(path).startswith(TOP_OF_APP)], ids=_relative)
def test_the_library_does_not_depend_on_the_shop(path: Path) -> None:
    shop = sorted(name for name in _imports(path) if "shop" in name or name.startswith("agents") or name == "app.catalogue")
    assert not shop, f"{_relative(path)} imports {shop}: the shop is built on the library, not the other way"
