"""A command's edge: what every weir command does with a setting, an argument or a broker it cannot use.

Each is one line on stderr naming what to change, and exit code 2, never a traceback: a ``WEIR_*`` variable or an
argument refused (:class:`app.settings.SettingError`), a broker that cannot be reached or refuses the client
(:class:`app.kafka_io.BrokerUnavailable`). The worker entry modules (``faust -A app.main worker``) read their settings
at import, inside Faust's command line, and leave the same way. ``--log-level`` is every command's, as ``-l`` is the
worker's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import NoReturn

from weir.app.kafka_io import BrokerUnavailable
from weir.app.settings import SettingError

__all__ = ["command_edge", "CommandParser", "add_log_level", "configure_logging", "LOG_LEVELS"]

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@contextlib.contextmanager
def command_edge(command: str = "weir") -> Iterator[None]:
    """Run a command's body; a refused setting or an unusable broker ends it with one line on stderr and exit code 2."""
    try:
        yield
    except (SettingError, BrokerUnavailable) as error:
        print(f"{command}: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


class CommandParser(argparse.ArgumentParser):
    """argparse's parser with a refused argument in one line: ``prog: message (--help lists the arguments)``, exit 2.

    argparse prints its usage (several lines for a command with many arguments) and then the error.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help lists the arguments)\n")


def add_log_level(parser: argparse.ArgumentParser, default: str = "info") -> None:
    parser.add_argument("--log-level", "-l", choices=LOG_LEVELS, default=default, type=str.lower, help="what to log (default: %(default)s)")


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (one of :data:`LOG_LEVELS`)."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr, force=True)
