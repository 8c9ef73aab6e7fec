"""Several flows modules in one deployment (``WEIR_FLOWS=a,b``): their flows run together and may await each other."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir import FlowGraphError, SettingError, Settings, TestDriver
from weir.app.flow_topology import load_flows


@pytest.fixture
def modules(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "kitchen_flows.py").write_text(
        "from weir import Flow\nFLOWS = [Flow('kitchen', source='kitchen').process('cook', lambda exchange: None)]\n"
    )
    (tmp_path / "dispatch_flows.py").write_text(
        "from weir import Flow, payload\n"
        "FLOWS = [Flow('dispatch', source='dispatch').barrier('ready', correlate_by=payload('order_id'), awaits=['kitchen'],"
        " timeout_ms=60_000).to('dispatched')]\n"
    )
    (tmp_path / "also_kitchen.py").write_text("from weir import Flow\nFLOWS = [Flow('kitchen', source='other').to('x')]\n")
    (tmp_path / "no_flows.py").write_text("FLOWS = 3\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("kitchen_flows", "dispatch_flows", "also_kitchen", "no_flows"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("modules")
def test_two_modules_run_together_and_one_awaits_the_others_flow() -> None:
    flows = load_flows("kitchen_flows, dispatch_flows")
    assert [flow.name for flow in flows] == ["kitchen", "dispatch"]
    with TestDriver(flows, Settings(partitions=2)) as driver:
        driver.pipe("dispatch", {"order_id": "o-1"}, key="o-1")
        assert driver.values("dispatched") == []
        driver.pipe("kitchen", {"order_id": "o-1"}, key="o-1")
        assert driver.values("dispatched") == [{"order_id": "o-1"}]


@pytest.mark.usefixtures("modules")
def test_modules_that_cannot_run_together_are_refused_naming_what() -> None:
    with pytest.raises(FlowGraphError, match="flow names must be unique"):
        TestDriver(load_flows("kitchen_flows,also_kitchen"))
    with pytest.raises(SettingError, match="the module 'no_flows' must define FLOWS"):
        load_flows("kitchen_flows,no_flows")
    with pytest.raises(SettingError, match="WEIR_FLOWS names no module"):
        load_flows(" , ")
