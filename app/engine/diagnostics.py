"""What a worker tells about itself: the trace file (``WEIR_TRACE_FILE``) and its consumer's state (``kill -USR1``)."""

from __future__ import annotations

import os
import time
from typing import Any

from faust.types import TP

from weir.app.engine.config import installed
from weir.app.engine.scopes import gate

__all__ = ["tracing", "trace", "describe_consumer", "committed_offsets"]


def tracing() -> bool:
    """Whether ``WEIR_TRACE_FILE`` is set (worth formatting a trace line)."""
    return installed().trace_file is not None


def trace(what: str, tp: TP, offset: int) -> None:
    trace_file = installed().trace_file
    if trace_file is not None:
        with open(trace_file, "a") as out:
            out.write(f"{time.time():.3f} {os.getpid()} {what} {tp.topic} {tp.partition} {offset}\n")


def describe_consumer(app: Any) -> list[str]:
    """Lines on the consumer's partitions, positions and offsets, and the commit gate (``app.core.dump_tasks``).

    Faust's and aiokafka's private books: assignment, active and paused partitions, fetch positions, the
    read, committed and acked offsets. A diagnostic only: what cannot be read ends the list with the error.
    """
    lines = []
    try:
        consumer: Any = app.consumer
        kafka = consumer._thread._consumer
        lines.append(f"assigned: {sorted(map(str, consumer.assignment()))}")
        lines.append(f"faust active: {sorted(map(str, consumer._active_partitions or ()))}")
        lines.append(f"faust paused: {sorted(map(str, consumer._paused_partitions))}")
        lines.append(f"kafka paused: {sorted(map(str, kafka.paused()))}")
        lines.append(f"flow control active: {app.flow_control.is_active()}")
        lines.append(f"gate: {gate.describe()}")
        for tp in sorted(consumer._active_partitions or (), key=str):
            position = kafka._subscription.subscription.assignment.state_value(tp)
            lines.append(
                f"{tp.topic}:{tp.partition} position={getattr(position, 'position', None)} "
                f"read={consumer._read_offset.get(tp)} committed={consumer._committed_offset.get(tp)} "
                f"acked={len(consumer._acked.get(tp) or [])} gaps={len(consumer._gap.get(tp) or [])}"
            )
    except Exception as error:  # diagnostics only
        lines.append(f"(consumer state unavailable: {error!r})")
    return lines


def committed_offsets(app: Any) -> dict[TP, int]:
    """The committed offset of each source partition assigned to this worker that has one (for the lag gauge).

    Faust's own book of them, ``Consumer._committed_offset``: read from the group at each seek, updated at each
    commit; no request to the broker. Empty while the consumer is not running.
    """
    try:
        consumer: Any = app.consumer
        assigned = consumer.assignment()
        return {tp: int(offset) for tp, offset in consumer._committed_offset.items() if offset is not None and tp in assigned}
    except Exception:  # not started yet, or stopping: nothing committed to show
        return {}
