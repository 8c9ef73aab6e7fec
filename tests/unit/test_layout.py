"""Imports run one way: engine -> runtime -> patterns -> web views and entry points; the shop and the examples on top,
through weir's published names only (checked on the source, by ast)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: weir's packages (the library a user installs).
LIBRARY = ("app", "agents", "tables")
#: Packages built on weir in this repository, as a user's would be: the ice-cream shop and the small examples.
USERS = ("shop", "examples")

#: Names the shop imports that weir uses itself but does not publish (not in their module's ``__all__``), each with
#: what the shop needs it for. Each is a place where weir's public API is short; the list may only shrink.
UNPUBLISHED: dict[tuple[str, str], str] = {}


def _weir_imports(path: Path, packages: tuple[str, ...]) -> list[tuple[str, str | None]]:
    """(module, name) for every absolute import of ``packages`` in ``path``; name None for ``import module``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
    # weir's code names its packages weir.app, weir.agents, weir.tables (the short names are the checkout's)
    short = [(module.removeprefix("weir."), name) for module, name in found]
    return [(module, name) for module, name in short if module.split(".")[0] in packages]


def _short_name_imports(path: Path) -> list[str]:
    """Absolute imports of ``app``, ``agents`` or ``tables`` by the short name (which a user's own package may own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [module for module in found if module.split(".")[0] in LIBRARY]


def _imports(path: Path) -> set[str]:
    """The weir modules ``path`` imports (absolute imports of app, agents and tables)."""
    return {module for module, _ in _weir_imports(path, LIBRARY)}


def _modules(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (ROOT / folder).rglob("*.py"))


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _source_of(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _published(module: str) -> frozenset[str] | None:
    """The names ``module`` lists in ``__all__`` (None: it has no ``__all__``, so it publishes nothing)."""
    source = _source_of(module)
    if source is None:
        return None
    for node in ast.parse(source.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets) and node.value is not None:
            return frozenset(ast.literal_eval(node.value))
    return None


def _unpublished_names(path: Path) -> list[str]:
    """What ``path`` imports of weir that weir does not publish: a private module or name, or a name missing from its
    module's ``__all__`` (a submodule, ``from app import flows``, is a module: its own ``__all__`` counts)."""
    problems = []
    for module, name in _weir_imports(path, LIBRARY):
        private = [part for part in [*module.split("."), name or ""] if part.startswith("_")]
        if private:
            problems.append(f"{module}:{name} (private: {private})")
            continue
        if name is None or _source_of(f"{module}.{name}") is not None or (module, name) in UNPUBLISHED:
            continue
        published = _published(module)
        if published is None or name not in published:
            problems.append(f"{module}:{name} (not in {module}.__all__)")
    return problems


@pytest.mark.parametrize("path", _modules(*LIBRARY, "weir", *USERS, "tests", "bench", "scripts"), ids=_relative)
def test_code_imports_weirs_packages_by_their_installed_names(path: Path) -> None:
    """``weir.app``, never ``app``: installed, weir is one top-level package, and a project's own ``app`` is its own."""
    short = _short_name_imports(path)
    assert not short, f"{_relative(path)} imports {short}: write weir.{short[0]}"


@pytest.mark.parametrize("path", _modules("app/engine"), ids=_relative)
def test_the_engine_imports_nothing_of_weir_but_itself(path: Path) -> None:
    outside = sorted(name for name in _imports(path) if not name.startswith("app.engine"))
    assert not outside, f"{_relative(path)} imports {outside}: the engine sits below everything"


@pytest.mark.parametrize("path", _modules("app/runtime"), ids=_relative)
def test_the_runtime_knows_no_pattern_and_no_web_server(path: Path) -> None:
    upward = sorted(name for name in _imports(path) if name.startswith(("agents", "tables", "app.web")))
    assert not upward, f"{_relative(path)} imports {upward}"


@pytest.mark.parametrize("path", _modules("tables"), ids=_relative)
def test_pattern_cores_and_tables_import_no_agent_and_no_web_server(path: Path) -> None:
    upward = sorted(name for name in _imports(path) if name.startswith("agents") or name == "app.web")
    assert not upward, f"{_relative(path)} imports {upward} (views register through app.runtime.views)"


@pytest.mark.parametrize("path", _modules("app"), ids=_relative)
def test_the_app_package_imports_no_agent(path: Path) -> None:
    """Agents are loaded by name (``app.main``), never imported by the modules under them."""
    agents = sorted(name for name in _imports(path) if name.split(".")[0] == "agents")
    assert not agents, f"{_relative(path)} imports {agents}"


@pytest.mark.parametrize("path", _modules(*LIBRARY), ids=_relative)
def test_the_library_knows_neither_the_shop_nor_the_examples(path: Path) -> None:
    """No import of them, and no module, setting or default of theirs named in code (a default ``module:NAME``)."""
    users = sorted(module for module, _ in _weir_imports(path, USERS))
    assert not users, f"{_relative(path)} imports {users}: the shop and the examples are built on the library, not the other way"
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings may point a reader there
    named = sorted(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and (re.search(r"\b(shop|examples)\.[a-z_]+", node.value) or "WEIR_SHOP_" in node.value)
    )
    assert not named, f"{_relative(path)} names code or settings of the shop or the examples: {named}"


def test_no_shop_or_example_module_is_left_in_the_library() -> None:
    left = [_relative(path) for path in _modules(*LIBRARY) if re.match(r"(shop|demo|catalogue)", path.stem)]
    assert not left, f"{left}: the shop and the examples live in shop/ and examples/"


@pytest.mark.parametrize("path", _modules(*USERS, "tests/unit/shop"), ids=_relative)
def test_the_shop_and_the_examples_import_only_what_weir_publishes(path: Path) -> None:
    problems = _unpublished_names(path)
    assert not problems, (
        f"{_relative(path)} imports {problems}: a user of weir imports what its modules list in __all__ "
        "(if weir should publish it, add it there; else tests/unit/test_layout.py UNPUBLISHED says why the shop needs it)"
    )


def test_every_unpublished_name_the_shop_needs_is_still_used_and_still_unpublished() -> None:
    """The list shrinks: a name weir publishes since, or the shop no longer imports, leaves it."""
    imported = {pair for path in _modules(*USERS, "tests/unit/shop") for pair in _weir_imports(path, LIBRARY)}
    for module, name in UNPUBLISHED:
        assert (module, name) in imported, f"{module}:{name} is no longer imported by the shop: drop it from UNPUBLISHED"
        assert name not in (_published(module) or ()), f"{module} publishes {name} now: drop it from UNPUBLISHED"
