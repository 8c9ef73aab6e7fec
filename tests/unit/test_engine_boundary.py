"""Internals of faust, aiokafka and mode are touched in app/engine/ only, and the engine refuses versions it was not tested with.

The rule, checked on the source of app/, agents/ and tables/ (app/engine/ excepted):

* ``x._name`` (one leading underscore, or a mangled ``__name``; never a dunder) is flagged unless ``x`` is
  ``self`` or ``cls``, or ``_name`` is defined in the same module (a function, class, assignment or
  ``self._name = ...`` there: the module's own private helper on a value of its own class), or the pair is
  in :data:`ALLOWED` with its reason. ``getattr``/``hasattr``/``setattr``/``delattr`` with a private name
  as a string constant count the same.
* A class that derives from a faust, aiokafka or mode class must not override a private attribute of that
  class (an internal) nor use ``self._name`` that its module does not define (an inherited internal); its own
  private helpers are its business.
* No private name is imported from faust, aiokafka or mode (``from faust.streams import _current_event``),
  nor a private module of theirs.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from weir.app import engine

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("app", "agents", "tables")
ENGINE = ROOT / "app" / "engine"
LIBRARIES = frozenset({"faust", "aiokafka", "mode"})

#: (module path, ``receiver._name`` as written) -> why: a weir module using another weir module's private name,
#: where that is deliberate (a smell, not an engine leak). None today: a module's own private helpers need no entry.
ALLOWED: dict[tuple[str, str], str] = {}

#: Standard-library names with a leading underscore that are public API on any object (namedtuple's methods).
PUBLIC_STDLIB = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults"})
#: Standard-library module functions whose underscore is historic: documented public API.
PUBLIC_STDLIB_FUNCTIONS = frozenset({("os", "_exit"), ("sys", "_getframe")})


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name != "_"


@dataclass(frozen=True)
class Leak:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def defined_names(tree: ast.AST) -> set[str]:
    """Every name the module defines itself: functions, classes, assigned names and ``self.<name>`` attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def library_aliases(tree: ast.AST) -> dict[str, tuple[str, str | None]]:
    """The local names bound to a faust, aiokafka or mode module or name: local name -> (module, name in it or None)."""
    aliases: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    if alias.asname:
                        aliases[alias.asname] = (alias.name, None)
                    else:
                        aliases[alias.name.split(".")[0]] = (alias.name.split(".")[0], None)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in LIBRARIES:
            for alias in node.names:
                aliases[alias.asname or alias.name] = (node.module, alias.name)
    return aliases


def library_base(base: ast.expr, aliases: dict[str, tuple[str, str | None]]) -> tuple[bool, Any]:
    """Whether ``base`` (a class's base expression) names a faust/aiokafka/mode object, and that object (None: not found)."""
    while isinstance(base, ast.Subscript):  # faust.Table[Any, Any]
        base = base.value
    path: list[str] = []
    while isinstance(base, ast.Attribute):
        path.insert(0, base.attr)
        base = base.value
    if not isinstance(base, ast.Name) or base.id not in aliases:
        return False, None
    module, name = aliases[base.id]
    try:
        found: Any = importlib.import_module(module)
        if name is not None:
            found = getattr(found, name) if hasattr(found, name) else importlib.import_module(f"{module}.{name}")
        for part in path:
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return True, None
    return True, found


def leaks_in(source: str, path: str) -> list[Leak]:
    tree = ast.parse(source, filename=path)
    local = defined_names(tree)
    aliases = library_aliases(tree)
    leaks: list[Leak] = []

    def allowed(receiver: ast.expr, name: str) -> bool:
        if isinstance(receiver, ast.Name) and (receiver.id in ("self", "cls") or (receiver.id, name) in PUBLIC_STDLIB_FUNCTIONS):
            return True
        return name in local or name in PUBLIC_STDLIB or (path, f"{ast.unparse(receiver)}.{name}") in ALLOWED

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] in LIBRARIES:
            if any(is_private(part) for part in node.module.split(".")):
                leaks.append(Leak(path, node.lineno, f"imports from the private module {node.module}"))
            leaks.extend(
                Leak(path, node.lineno, f"imports {alias.name} from {node.module}") for alias in node.names if is_private(alias.name)
            )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIBRARIES and any(is_private(part) for part in parts):
                    leaks.append(Leak(path, node.lineno, f"imports the private module {alias.name}"))
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and not allowed(node.value, node.attr):
            leaks.append(Leak(path, node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
            and not allowed(node.args[0], node.args[1].value)
        ):
            leaks.append(Leak(path, node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"))
        elif isinstance(node, ast.ClassDef) and any(library_base(base, aliases)[0] for base in node.bases):
            bases = [found for is_library, found in map(lambda base: library_base(base, aliases), node.bases) if is_library]
            for item in ast.walk(node):
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and is_private(item.name)
                    and any(found is None or hasattr(found, item.name) for found in bases)  # unresolved: assume an override
                ):
                    leaks.append(Leak(path, item.lineno, f"class {node.name} overrides {item.name} of a library class"))
                elif (
                    isinstance(item, ast.Attribute)
                    and isinstance(item.value, ast.Name)
                    and item.value.id in ("self", "cls")
                    and is_private(item.attr)
                    and item.attr not in local
                ):
                    leaks.append(Leak(path, item.lineno, f"class {node.name} uses the inherited {item.value.id}.{item.attr}"))
    return leaks


def scanned_files() -> list[Path]:
    files = [path for folder in SCANNED for path in sorted((ROOT / folder).rglob("*.py"))]
    return [path for path in files if ENGINE not in path.parents]


def test_nothing_outside_the_engine_touches_library_internals() -> None:
    files = scanned_files()
    assert any(path.name == "core.py" for path in files)
    assert not any(ENGINE in path.parents for path in files)
    leaks = [leak for path in files for leak in leaks_in(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not leaks, "private names of faust/aiokafka/mode (or of another module) used outside app/engine/:\n" + "\n".join(map(str, leaks))


def test_every_allowed_access_is_still_there() -> None:
    """An allow-list entry whose access went away is removed, not kept as a blank cheque."""
    for path, written in ALLOWED:
        assert written in (ROOT / path).read_text(), f"{path}: {written} is allowed but no longer used"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(consumer):\n    return consumer._acked\n", "consumer._acked"),
        ("def f(store):\n    return getattr(store, '_dbs', None)\n", "getattr(store, '_dbs')"),
        ("from faust.streams import _current_event\n", "imports _current_event from faust.streams"),
        ("import aiokafka._internal\n", "imports the private module aiokafka._internal"),
        ("import faust\nclass T(faust.Topic):\n    def _get_producer(self):\n        pass\n", "overrides _get_producer"),
        (
            "from faust.transport import consumer\nclass C(consumer.Consumer):\n    def lag(self):\n        return self._acked\n",
            "inherited self._acked",
        ),
    ],
)
def test_the_scanner_finds_each_kind_of_leak(source: str, expected: str) -> None:
    found = [leak.what for leak in leaks_in(source, "example.py")]
    assert any(expected in what for what in found), found


@pytest.mark.parametrize(
    "source",
    [
        "class Flow:\n    def _open_split(self):\n        pass\n\ndef check(flow):\n    return flow._open_split()\n",
        "class Sender:\n    def __init__(self):\n        self._producer = None\n    def stop(self):\n        self._producer = None\n",
        "def f(record):\n    return record._replace(a=1), record.__class__\n",
        "import os\ndef stop():\n    os._exit(70)\n",
        "import faust\nclass Order(faust.Record):\n    total: int\n    def __post_init__(self):\n        pass\n",
        "from faust import web\nclass View(web.View):\n    async def _refuse(self, request):\n        return self._answer()\n"
        "    def _answer(self):\n        pass\n",
    ],
)
def test_the_scanner_lets_a_module_use_its_own_private_names(source: str) -> None:
    assert leaks_in(source, "example.py") == []


def test_the_installed_versions_are_the_tested_ones() -> None:
    assert set(engine.TESTED_VERSIONS) == {"faust-streaming", "aiokafka", "mode-streaming"}
    engine.check_versions()  # what install() does first
    assert engine.TESTED_VERSIONS["faust-streaming"] == importlib.metadata.version("faust-streaming")


def test_a_version_mismatch_is_refused_naming_both_versions() -> None:
    installed = {"faust-streaming": "0.15.3", "aiokafka": "0.15.0", "mode-streaming": "0.7.1"}
    expected = r"aiokafka 0\.15\.0 is installed, but app\.engine was tested with aiokafka 0\.14\.0"
    with pytest.raises(RuntimeError, match=expected) as raised:
        engine.check_versions(installed=installed.__getitem__)
    assert "faust-streaming" not in str(raised.value)


def test_a_missing_distribution_is_refused_by_name() -> None:
    def installed(distribution: str) -> str:
        raise importlib.metadata.PackageNotFoundError(distribution)

    with pytest.raises(RuntimeError, match=r"mode-streaming is not installed, but app\.engine was tested with mode-streaming 0\.7\.1"):
        engine.check_versions({"mode-streaming": "0.7.1"}, installed=installed)
