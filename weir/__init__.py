"""weir's public API: what an application imports to declare its flows, configure them and test them.

    from weir import Flow, Settings, TestDriver, payload

The application (a worker as an object: settings, user code, agent sets), flows and their test driver; the
clients of the patterns: an end-of-stream job and its :class:`Gateway`, the
counter trigger's messages, the outbox and the children's status.

Everything else in the repository's ``app``, ``agents`` and ``tables`` packages is weir's own and may change.
"""

from __future__ import annotations

from weir.app.application import AgentSet, Application
from weir.app.edge import CommandParser, command_edge
from weir.app.eof_gateway import Gateway
from weir.app.errors import attempt
from weir.app.flows import Await, Exchange, Flow, FlowDeclarationError, FlowGraphError, KeyExpr, header, payload
from weir.app.outbox import open_outbox, write
from weir.app.settings import SettingError, Settings
from weir.app.testing import Crashed, TestDriver, TestRecord, VirtualClock
from weir.app.trigger_status import CompletionPublisher, child_done, open_status_source, record_status
from weir.app.windows import Window, count, total
from weir.tables.eof import Dropped, EofJob
from weir.tables.triggers import completion_message, publish_trigger_messages, registration_message
from weir.tables.windows import SessionSpec, WindowSpec, windows_between

__all__ = [
    "AgentSet",
    "CompletionPublisher",
    "Application",
    "attempt",
    "Await",
    "Crashed",
    "Dropped",
    "EofJob",
    "Exchange",
    "Flow",
    "FlowDeclarationError",
    "FlowGraphError",
    "Gateway",
    "KeyExpr",
    "SessionSpec",
    "SettingError",
    "Settings",
    "TestDriver",
    "TestRecord",
    "VirtualClock",
    "Window",
    "WindowSpec",
    "child_done",
    "command_edge",
    "CommandParser",
    "completion_message",
    "count",
    "header",
    "open_outbox",
    "open_status_source",
    "payload",
    "publish_trigger_messages",
    "record_status",
    "windows_between",
    "registration_message",
    "total",
    "write",
]
