"""weir's public API: what an application imports to declare its flows, configure them and test them.

    from weir import Flow, Settings, TestDriver, payload

Everything else in the repository's ``app``, ``agents`` and ``tables`` packages is weir's own and may change.
"""

from __future__ import annotations

from app.flows import Await, Exchange, Flow, FlowDeclarationError, FlowGraphError, KeyExpr, header, payload
from app.settings import Settings
from app.testing import Crashed, TestDriver, TestRecord, VirtualClock
from tables.eof import Dropped, EofJob

__all__ = [
    "Await",
    "Crashed",
    "Dropped",
    "EofJob",
    "Exchange",
    "Flow",
    "FlowDeclarationError",
    "FlowGraphError",
    "KeyExpr",
    "Settings",
    "TestDriver",
    "TestRecord",
    "VirtualClock",
    "header",
    "payload",
]
