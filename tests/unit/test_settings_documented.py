"""The README's settings tables and the code that reads the variables name the same settings, both ways.

weir's table lists what ``app/settings.py`` reads (``Settings.from_env`` and the broker's and PostgreSQL's defaults);
the shop's table lists what ``shop/settings.py`` reads. A variable read and not documented, or documented and never
read (renamed, removed), fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"""["']((?:WEIR|KAFKA|DATABASE)_[A-Z0-9_]+)["']""")
ROW = re.compile(r"^\| ([^|]+) \|")
NAME = re.compile(r"`((?:WEIR|KAFKA|DATABASE)_[A-Z0-9_]+)`")


def read_by(path: str) -> set[str]:
    """The variables a settings module reads: every quoted name it passes to a reader."""
    return set(READ.findall((ROOT / path).read_text()))


def readme_tables() -> list[set[str]]:
    """The variables of each table of the README's Settings section, from the first column of each row."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    tables: list[set[str]] = []
    in_table = False
    for line in section.splitlines():
        row = ROW.match(line)
        if not row:
            in_table = False
            continue
        if not in_table:
            tables.append(set())
            in_table = True
        tables[-1].update(NAME.findall(row.group(1)))
    return [table for table in tables if table]


def test_the_readme_has_weirs_table_and_the_shops() -> None:
    assert len(readme_tables()) == 2


def test_every_variable_weir_reads_is_in_the_readme_and_every_row_is_read() -> None:
    weir, _ = readme_tables()
    read = read_by("app/settings.py")
    assert read - weir == set(), "read by app/settings.py, missing from the README's settings table"
    assert weir - read == set(), "in the README's settings table, never read by app/settings.py"


def test_every_variable_the_shop_reads_is_in_the_readme_and_every_row_is_read() -> None:
    _, shop = readme_tables()
    read = read_by("shop/settings.py")
    assert read - shop == set(), "read by shop/settings.py, missing from the README's shop table"
    assert shop - read == set(), "in the README's shop table, never read by shop/settings.py"
