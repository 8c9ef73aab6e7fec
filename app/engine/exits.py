"""A crashed worker's process ends: within :data:`EXIT_GRACE_S` of the crash, whatever state its services are in.

A worker crashes (``App.crash``) when going on could commit wrong work: its producer fenced, a store ahead of its
changelog, an error that escaped an agent's loop. mode then stops the worker's services and the process exits
(code 1), to be restarted by whatever runs it. After a broker outage that did not always happen: the crash came
while the consumer was rebalancing, the app was marked crashed but the worker never stopped; it rejoined its group,
took its partitions, committed nothing (its commits refused) and held them for good (a broker-SIGKILL test stalled
with a third of its orders unanswered). Every crash now also starts a timer: a process still alive
:data:`EXIT_GRACE_S` later logs why and exits at once (``os._exit(1)``). Nothing is lost by it: what the worker did
is committed in Kafka or not at all, and its store is rebuilt from the changelog at its next start.

Patch: ``faust.app.base.App.crash`` is wrapped (it is mode's ``Service.crash``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import faust.app.base

log = logging.getLogger(__name__)

__all__ = ["EXIT_GRACE_S", "exit_after_crash"]

#: Seconds a crashed worker has to stop by itself (a normal stop takes a few) before its process exits regardless.
EXIT_GRACE_S = 15.0

_armed: list[threading.Timer] = []


def _exit_now(reason: BaseException, grace_s: float) -> None:
    log.critical("the worker has not stopped %g s after its crash (%r): its process exits now", grace_s, reason)
    sys.stderr.flush()
    os._exit(1)


def arm(reason: BaseException, grace_s: float | None = None) -> None:
    """Exit the process ``grace_s`` (default :data:`EXIT_GRACE_S`) from now unless it has exited by then. Once."""
    if _armed:
        return
    grace = EXIT_GRACE_S if grace_s is None else grace_s
    timer = threading.Timer(grace, _exit_now, args=(reason, grace))
    timer.daemon = True
    timer.start()
    _armed.append(timer)


def exit_after_crash() -> None:
    """Make every Faust app's crash end its process (:func:`arm`). Idempotent."""
    app_class: Any = faust.app.base.App
    if getattr(app_class.crash, "weir_exits", False):
        return
    original = app_class.crash

    async def crash(self: Any, reason: BaseException) -> None:
        arm(reason)
        await original(self, reason)

    crash.weir_exits = True  # type: ignore[attr-defined]
    app_class.crash = crash
