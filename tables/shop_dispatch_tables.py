"""The shop's dispatch table and its deadline index."""

from __future__ import annotations

from app.core import json_table
from app.runtime.views import register_view

__all__ = ["dispatch", "dispatch_deadlines"]

dispatch = json_table(
    "shop_dispatch",
    "Orders at the dispatch barrier by ticket: the kitchen's answer per flavour and the payment's, the "
    "deadline; then the outcome, kept to compensate late answers (value: tables.shop.Dispatch or "
    "DispatchDone).",
)
dispatch_deadlines = json_table(
    "shop_dispatch_deadlines",
    "Deadline index of table shop_dispatch (app.deadlines.DeadlineIndex).",
)

register_view(
    "shop_dispatch",
    title="orders at the dispatch barrier",
    summarize=lambda value, now_ms: (
        {"status": value["status"], "reason": value["reason"], "resolved_ms": value["resolved_ms"]}
        if value.get("done")
        else {
            "status": "waiting",
            "screen": value["screen"],
            "line": value["line"],
            "kitchen": f"{len(value['kitchen'])}/{len(value['flavours'])}",
            "payment": {None: "awaited", True: "captured", False: "rejected"}[value["paid"]],
            "deadline_ms": value["deadline_ms"],
        }
    ),
    group_by=lambda value: str(value["status"]) if value.get("done") else "waiting",
)
