"""scripts/check_compose.py: the real docker/compose.yaml passes, broken copies of it are reported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from weir.app.settings import AGENT_NAMES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKER_DIR = COMPOSE.parent


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_compose", ROOT / "scripts" / "check_compose.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_compose", module)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()


def _real() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _check_copy(tmp_path: Path, data: dict[str, Any]) -> list[str]:
    """Write ``data`` as a compose file in a temp folder and check it as if it sat in docker/."""
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    errors: list[str] = checker.check_compose(path, base_dir=DOCKER_DIR)
    return errors


def _check_text(tmp_path: Path, old: str, new: str) -> list[str]:
    """Check a textual edit of the real file (anchors and comments kept)."""
    text = COMPOSE.read_text(encoding="utf-8")
    assert old in text, f"{old!r} no longer in {COMPOSE}; update the test"
    path = tmp_path / "compose.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    errors: list[str] = checker.check_compose(path, base_dir=DOCKER_DIR)
    return errors


def test_real_compose_file_passes() -> None:
    assert checker.check_compose(COMPOSE) == []


def test_real_compose_file_has_a_service_per_agent_and_a_healthy_broker_and_database() -> None:
    services = _real()["services"]
    for agent in AGENT_NAMES:
        named = [name for name in services if name == agent or name.rpartition("_")[0] == agent]
        assert named, agent
        for name in named:
            assert checker._environment(services[name])["WEIR_AGENTS"] == agent
            assert services[name]["depends_on"] == {"kafka": {"condition": "service_healthy"}, "postgres": {"condition": "service_healthy"}}
    assert {"items_1", "items_2", "shop_payments_1", "shop_payments_2", "shop_kitchen_1", "shop_kitchen_2"} <= set(services)
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"][1]


def test_the_whole_system_runs_the_relay_the_screens_and_one_database_for_outbox_and_sweep() -> None:
    services = _real()["services"]
    assert services["outbox_relay"]["command"][:3] == ["python", "-m", "app.outbox_relay"]
    assert services["shop_screens"]["command"][:4] == ["python", "-m", "shop.demo", "--attach"]
    screens_wait_for = set(services["shop_screens"]["depends_on"])
    assert {name for name in services if name.startswith("shop_") and name != "shop_screens"} <= screens_wait_for
    databases = {checker._environment(service).get("WEIR_OUTBOX_DB") for service in services.values() if "build" in service}
    assert databases == {"postgresql://weir@postgres:5432/weir"}, "the relay, the triggers' sweep and every worker: one outbox"


def test_every_worker_advertises_its_service_name_and_a_port_of_its_own() -> None:
    services = _real()["services"]
    ports = {}
    for name, service in services.items():
        if "WEIR_AGENTS" not in checker._environment(service):
            continue
        command = service["command"]
        assert command[command.index("--web-host") + 1] == name
        ports[name] = command[command.index("--web-port") + 1]
        assert service["ports"] == [f"127.0.0.1:{ports[name]}:{ports[name]}"]
    assert len(ports) == 18
    assert len(set(ports.values())) == len(ports)


def test_a_document_the_compose_schema_refuses_is_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["splitter"]["restart"] = 5
    data["services"]["aggregator"]["healthcheck"] = {"tset": ["CMD", "true"]}
    errors = _check_copy(tmp_path, data)
    assert any(error.startswith("schema: services/splitter/restart: 5 is not of type 'string'") for error in errors), errors
    assert any(error.startswith("schema: services/aggregator/healthcheck") and "tset" in error for error in errors), errors


def test_two_workers_on_one_address_are_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["items_2"]["command"][-1] = "6067"  # items_1's port
    data["services"]["items_1"]["command"][data["services"]["items_1"]["command"].index("--web-host") + 1] = "0.0.0.0"
    data["services"]["shop_kitchen_1"]["deploy"] = {"replicas": 2}
    errors = _check_copy(tmp_path, data)
    assert any("service items_2: web port 6067 is service items_1's too" in error for error in errors), errors
    assert any("service items_2: WEIR_WEB_PORT=6068 but --web-port 6067" in error for error in errors), errors
    assert any("service items_1: advertises --web-host '0.0.0.0'" in error for error in errors), errors
    assert any("service shop_kitchen_1: 2 replicas would advertise one address" in error for error in errors), errors


def test_main_prints_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert checker.main([str(COMPOSE)]) == 0
    assert capsys.readouterr().out.strip() == f"compose ok: {len(_real()['services'])} services"


def test_missing_agent_service_is_reported(tmp_path: Path) -> None:
    data = _real()
    del data["services"]["items_1"]
    del data["services"]["items_2"]
    errors = _check_copy(tmp_path, data)
    assert any("no service for agent 'items'" in error for error in errors), errors


def test_wrong_weir_agents_is_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["splitter"]["environment"]["WEIR_AGENTS"] = "items"
    errors = _check_copy(tmp_path, data)
    assert any("service splitter: WEIR_AGENTS is 'items'" in error for error in errors), errors


def test_unknown_depends_on_is_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["aggregator"]["depends_on"] = {"zookeeper": {"condition": "service_started"}}
    errors = _check_copy(tmp_path, data)
    assert any("service aggregator: depends_on names unknown service 'zookeeper'" in error for error in errors), errors


def test_port_on_every_interface_is_reported(tmp_path: Path) -> None:
    errors = _check_text(tmp_path, '"127.0.0.1:6069:6069"', '"0.0.0.0:6069:6069"')
    assert any("service aggregator: port '0.0.0.0:6069:6069' is published on 0.0.0.0" in error for error in errors), errors


def test_port_without_host_address_is_reported(tmp_path: Path) -> None:
    errors = _check_text(tmp_path, '"127.0.0.1:6069:6069"', '"6069:6069"')
    assert any("published on every interface" in error for error in errors), errors


def test_missing_dockerfile_and_undeclared_volume_are_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["splitter"]["build"] = {"context": "..", "dockerfile": "docker/Nope.Dockerfile"}
    del data["volumes"]["aggregator-data"]
    errors = _check_copy(tmp_path, data)
    assert any("service splitter: dockerfile 'docker/Nope.Dockerfile' not found" in error for error in errors), errors
    assert any("service aggregator: named volume 'aggregator-data' is not declared" in error for error in errors), errors


def test_missing_broker_is_reported(tmp_path: Path) -> None:
    data = _real()
    del data["services"]["kafka"]
    errors = _check_copy(tmp_path, data)
    assert any("no 'kafka' service" in error for error in errors), errors
    assert any("depends_on names unknown service 'kafka'" in error for error in errors), errors


def test_main_fails_on_a_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _real()
    del data["services"]["aggregator"]
    path = tmp_path / "docker" / "compose.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert checker.main([str(path)]) == 1
    assert "no service for agent 'aggregator'" in capsys.readouterr().err


def test_missing_bind_mount_source_is_reported(tmp_path: Path) -> None:
    errors = _check_text(tmp_path, "./prometheus.yml:/etc/prometheus", "./nope.yml:/etc/prometheus")
    assert any(
        "service prometheus: bind mount './nope.yml:/etc/prometheus/prometheus.yml:ro': './nope.yml' not found" in error for error in errors
    ), errors


def test_missing_long_form_bind_mount_source_is_reported(tmp_path: Path) -> None:
    data = _real()
    data["services"]["grafana"]["volumes"] = [{"type": "bind", "source": "grafana/nope", "target": "/etc/grafana/provisioning"}]
    errors = _check_copy(tmp_path, data)
    assert any("service grafana: bind mount" in error and "'grafana/nope' not found" in error for error in errors), errors


def test_real_compose_file_publishes_prometheus_and_grafana_on_loopback() -> None:
    services = _real()["services"]
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    assert services["grafana"]["ports"] == ["127.0.0.1:3000:3000"]


def test_a_shop_service_without_the_shops_entry_module_is_reported(tmp_path: Path) -> None:
    """The shop's agent sets exist only in a worker its entry module (shop.main) starts."""
    data = _real()
    del data["services"]["shop_kitchen_1"]["command"]
    errors = _check_copy(tmp_path, data)
    unknown = "service shop_kitchen_1: WEIR_AGENTS='shop_kitchen' names unknown agent(s) ['shop_kitchen']"
    assert any(unknown in error for error in errors), errors


def test_the_flows_agents_need_their_flows_module(tmp_path: Path) -> None:
    data = _real()
    del data["services"]["shop_dispatch"]["environment"]["WEIR_FLOWS"]
    errors = _check_copy(tmp_path, data)
    assert any("service shop_dispatch: WEIR_AGENTS='flows' names unknown agent(s) ['flows']" in error for error in errors), errors
