"""The views registry: how the web views show each pattern's table values (``register_view``).

A pattern's tables register their summaries here; the web server (``app.web``) reads the registry. Keeping
the registry apart from the server lets a pattern describe its views without importing the web layer.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Summarize", "GroupBy", "PatternView", "register_view", "view_for"]

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
    exact = _views.get(table_name)
    if exact is not None:
        return exact
    matching = [view for pattern, view in _views.items() if "*" in pattern and fnmatch.fnmatchcase(table_name, pattern)]
    return max(matching, key=lambda view: len(view.pattern), default=None)
