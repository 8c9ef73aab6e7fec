"""The views registry: how the web views show each pattern's table values (``register_view``).

A pattern's tables register their summaries here; the web server (``app.web``) reads the registry. Keeping
the registry apart from the server lets a pattern describe its views without importing the web layer.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Summarize", "GroupBy", "PatternView", "register_view", "view_for", "best_match"]

T = TypeVar("T")

Summarize = Callable[[Any, int], Mapping[str, Any]]
GroupBy = Callable[[Any], str]


@dataclass(frozen=True)
class PatternView:
    """How the pages show the values of one table (or of every table whose name matches ``pattern``)."""

    pattern: str
    title: str
    summarize: Summarize
    group_by: GroupBy | None = None


_views: dict[str, PatternView] = {}


def register_view(table_name: str, *, summarize: Summarize, title: str | None = None, group_by: GroupBy | None = None) -> PatternView:
    """Show each value of ``table_name`` as ``summarize(value, now_ms)`` in the list and key pages (HTML and JSON).

    ``table_name`` may hold ``*`` wildcards for tables named at run time (``"barrier-*"``); an exact name wins
    over a pattern, and a longer pattern over a shorter one. ``summarize`` gets the decoded JSON value and the
    clock, and returns a flat mapping of JSON-able fields; a field named ``deadline_ms`` is shown as "due in N s"
    with a live countdown. ``group_by(value)``, when given, names each value's group (a payment's state): the
    table page counts the keys of each group over the whole table. Registering a name again replaces its view.
    """
    view = PatternView(pattern=table_name, title=title or table_name, summarize=summarize, group_by=group_by)
    _views[table_name] = view
    return view


def view_for(table_name: str) -> PatternView | None:
    """The view registered for ``table_name``: its exact name, else the longest matching pattern."""
    return best_match(table_name, _views)


def best_match(table_name: str, registered: Mapping[str, T]) -> T | None:
    """What ``registered`` holds for ``table_name``: under its exact name, else under the longest ``*`` pattern it matches.

    The one rule by which a table finds what its pattern registered (its view here, its gauge in :mod:`app.metrics`).
    """
    if table_name in registered:
        return registered[table_name]
    matching = [pattern for pattern in registered if "*" in pattern and fnmatch.fnmatchcase(table_name, pattern)]
    return registered[max(matching, key=len)] if matching else None
