"""The repository's own names for weir's packages: ``app``, ``agents`` and ``tables`` run from a checkout.

Installed, weir is one top-level package: its worker, its agents and its tables are ``weir.app``, ``weir.agents``
and ``weir.tables`` (in the repository, ``weir/app`` is a link to ``app/``, and so on), and weir's code imports only
those names, so a project with its own ``app`` package can install weir. From the repository's root the short names
keep working for the command line (``faust -A app.main worker``, ``python -m app.outbox_relay``): importing
``app`` installs :class:`CheckoutNames`, which hands out the ``weir.`` module itself for ``app.<x>`` (one module
object under two names, never two copies of its state).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

__all__ = ["PACKAGES", "CheckoutNames", "alias"]

#: weir's packages that a checkout also names at the top level.
PACKAGES = ("app", "agents", "tables")


class CheckoutNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``app.x`` (``agents.x``, ``tables.x``) is ``weir.app.x``: the same module object, imported once."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        top, dot, _ = fullname.partition(".")
        if top not in PACKAGES or not dot:
            return None
        spec = importlib.util.find_spec(f"weir.{fullname}")
        if spec is None:
            return None
        # the file's path as origin: ``python -m app.x`` sets sys.argv[0] from it (argparse names the command by it)
        return importlib.util.spec_from_loader(fullname, self, origin=spec.origin)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(f"weir.{spec.name}")
        self._specs[spec.name] = module.__spec__  # the import system writes the short name's spec over it
        return module

    def exec_module(self, module: ModuleType) -> None:
        for short, spec in list(self._specs.items()):
            if sys.modules.get(short) is module:
                module.__spec__ = spec
                del self._specs[short]

    def get_code(self, fullname: str) -> CodeType | None:
        """``python -m app.x`` runs ``weir.app.x``'s code as ``__main__``."""
        spec = importlib.util.find_spec(f"weir.{fullname}")
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(f"weir.{fullname}")


def alias(short: str) -> None:
    """Make the top-level package ``short`` (being imported from a checkout) the name of ``weir.<short>``."""
    if not any(isinstance(finder, CheckoutNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, CheckoutNames())
    sys.modules[short] = importlib.import_module(f"weir.{short}")
