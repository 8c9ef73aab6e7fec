"""The windowed aggregation the broker tests run (``WEIR_WINDOWS=tests.integration.window_defs``)."""

from __future__ import annotations

from weir import Window, WindowSpec, count

#: clicks per user and second, on the records' own timestamps, open half a second after their end
WINDOWS = [Window("clicks", source="clicks", to="click-counts", spec=WindowSpec.tumbling(1_000, grace_ms=500), fold=count)]
