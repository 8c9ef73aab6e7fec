"""Item steps the end-to-end tests run inside real workers (named by WEIR_ITEM_PROCESSOR)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


async def test_step(payload: Any) -> dict[str, Any]:
    """Sleeps ``sleep_s`` without blocking the worker, fails on ``poison``, and reports its own time window."""
    started = time.time()
    if payload.get("poison"):
        raise ValueError(f"poisoned item {payload.get('value')!r}")
    if payload.get("sleep_s"):
        await asyncio.sleep(float(payload["sleep_s"]))
    value = payload.get("value")
    if payload.get("inflate"):  # a result much larger than the item: the merged result may outgrow a record
        value = f"{value}:" + "x" * int(payload["inflate"])
    return {"value": value, "started": started, "finished": time.time(), "pid": os.getpid()}
