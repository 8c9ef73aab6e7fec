"""The windowed aggregation the broker tests run (``WEIR_WINDOWS=tests.integration.window_defs``), and a flow with a
window step (``WEIR_FLOWS=tests.integration.window_defs``)."""

from __future__ import annotations

from weir import Flow, Window, WindowSpec, count

#: clicks per user and second, on the records' own timestamps, open half a second after their end
WINDOWS = [Window("clicks", source="clicks", to="click-counts", spec=WindowSpec.tumbling(1_000, grace_ms=500), fold=count)]

#: clicks per user and second as a flow's step, on the source records' timestamps; each result goes on to a topic
FLOWS = [Flow("clicks", source="flow-clicks").window("per-second", WindowSpec.tumbling(1_000, grace_ms=500)).to("flow-click-counts")]
