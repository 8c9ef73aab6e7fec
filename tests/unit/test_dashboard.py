"""The Grafana dashboard, its provisioning and the Prometheus config of docker/: they parse, and name only what exists.

Every PromQL expression of the dashboard may use only metrics app.metrics registers (with the labels they
have), Prometheus scrapes every worker service of docker/compose.yaml on the port its container listens on,
and the files compose mounts are the ones Grafana and Prometheus are configured to read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from weir.app import metrics

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
PROMETHEUS = DOCKER / "prometheus.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "weir.json"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
DASHBOARD_PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards" / "weir.yaml"

#: Labels Prometheus adds to every scraped series (docker/prometheus.yml's relabelling adds ``service``).
TARGET_LABELS = {"job", "instance", "service"}
#: PromQL words that are not metric names: functions, aggregations, operators and modifiers the dashboard may use.
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "by", "without", "on", "ignoring",
    "group_left", "group_right", "and", "or", "unless", "offset", "bool", "rate", "irate", "increase", "delta",
    "histogram_quantile", "clamp_min", "clamp_max", "abs", "time", "vector", "scalar", "max_over_time",
    "min_over_time", "avg_over_time", "changes", "resets", "label_replace", "absent",
}  # fmt: skip
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _exported() -> dict[str, set[str]]:
    """Every sample name weir's /metrics can show -> the label names it carries (read from app.metrics' registry)."""
    labels_of: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            labels_of[value._name] = set(value._labelnames)  # no public accessor for a metric's label names
    for collector in (metrics.COLLECTOR, metrics.OUTBOX_COLLECTOR):
        for family in collector.describe():
            labels_of[family.name] = set(getattr(family, "_labelnames", ()))
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"), "gauge": ("",)}
    names: dict[str, set[str]] = {}
    for family in metrics.REGISTRY.collect():
        labels = labels_of.get(family.name) or {label for sample in family.samples for label in sample.labels}
        for suffix in suffixes.get(family.type, ("",)):
            names[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included (rows themselves left out)."""
    found = []
    for panel in dashboard["panels"]:
        if panel.get("type") != "row":
            found.append(panel)
        found += panel.get("panels", [])
    return found


def _metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once labels, ranges, strings and words are taken out."""
    stripped = _GROUPING.sub(" ", expr)
    stripped = _MATCHERS.sub(" ", stripped)
    stripped = re.sub(r"\[[^\]]*\]", " ", stripped)
    stripped = re.sub(r'"[^"]*"', " ", stripped)
    return {word for word in _IDENTIFIER.findall(stripped) if word not in PROMQL_WORDS}


def _labels_in(expr: str) -> set[str]:
    """The label names an expression groups by or matches on."""
    labels = {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
    labels |= {match.split("=")[0].strip(" !~") for group in _MATCHERS.findall(expr) for match in group.split(",") if match.strip()}
    return labels


def _targets() -> list[tuple[str, dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [(panel["title"], target) for panel in _panels(dashboard) for target in panel.get("targets", [])]


def _worker_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _load_yaml(COMPOSE)["services"]
    return {name: service for name, service in services.items() if "WEIR_AGENTS" in (service.get("environment") or {})}


def test_dashboard_parses_with_unique_panel_ids_and_the_provisioned_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    datasource_uid = _load_yaml(DATASOURCES)["datasources"][0]["uid"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"]
    assert dashboard["title"] == "weir"
    for panel in _panels(dashboard):
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == datasource_uid, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == datasource_uid, panel["title"]


def test_every_expression_reads_only_metrics_and_labels_app_metrics_registers() -> None:
    exported = _exported()
    problems = []
    for title, target in _targets():
        expr = target["expr"]
        used = _metrics_in(expr)
        if not used:
            problems.append(f"panel {title!r}: expression {expr!r} reads no metric")
        unknown = used - exported.keys()
        if unknown:
            problems.append(f"panel {title!r}: {sorted(unknown)} not registered in app.metrics (expression {expr!r})")
        allowed = TARGET_LABELS.union(*(exported.get(name, set()) for name in used))
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        stray = (_labels_in(expr) | legend) - allowed
        if stray:
            problems.append(f"panel {title!r}: labels {sorted(stray)} are not labels of {sorted(used)} (expression {expr!r})")
    assert not problems, "\n".join(problems)


def test_every_weir_metric_is_on_the_dashboard() -> None:
    shown = {name for _, target in _targets() for name in _metrics_in(target["expr"])}
    families = {name.removesuffix("_bucket").removesuffix("_total") for name in shown}
    missing = [family.name for family in metrics.REGISTRY.collect() if family.name.startswith("weir_") and family.name not in families]
    assert missing == []


def test_metric_check_catches_a_name_app_metrics_does_not_register() -> None:
    assert _metrics_in("sum by (topic, partition) (rate(weir_consumer_lag_total[5m]))") == {"weir_consumer_lag_total"}
    assert "weir_consumer_lag_total" not in _exported()
    assert _labels_in('sum by (agent) (rate(weir_commits_total{outcome!="committed"}[5m]))') == {"agent", "outcome"}
    assert "agent" not in _exported()["weir_commits_total"]


def test_prometheus_scrapes_every_worker_service_and_the_relay_on_its_own_port() -> None:
    config = _load_yaml(PROMETHEUS)
    scraped: dict[str, int] = {}
    labels: dict[str, str] = {}
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, target_port = target.rpartition(":")
                scraped[host] = int(target_port)
                labels[host] = static.get("labels", {}).get("service")
    services: dict[str, dict[str, Any]] = _load_yaml(COMPOSE)["services"]
    expected: dict[str, int] = {}
    for name, service in services.items():
        command = [str(word) for word in service.get("command") or []]
        if name in _worker_services():
            expected[name] = int(command[command.index("--web-port") + 1])
        elif "app.outbox_relay" in command:
            expected[name] = int(command[command.index("--metrics-port") + 1])
    assert len(expected) > 10, "the compose file's workers and relay"
    assert scraped == expected
    assert labels == {name: name for name in expected}, "each target labelled with its service, as the panels group by it"


def test_compose_mounts_the_files_prometheus_and_grafana_read() -> None:
    services = _load_yaml(COMPOSE)["services"]
    mounts = {
        name: {volume.split(":")[1]: volume.split(":")[0] for volume in services[name]["volumes"] if volume.startswith(".")}
        for name in ("prometheus", "grafana")
    }
    assert (DOCKER / mounts["prometheus"]["/etc/prometheus/prometheus.yml"]).resolve() == PROMETHEUS
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert (DOCKER / mounts["grafana"]["/etc/grafana/provisioning"]).resolve() == DATASOURCES.parent.parent
    dashboards_folder = _load_yaml(DASHBOARD_PROVIDERS)["providers"][0]["options"]["path"]
    assert (DOCKER / mounts["grafana"][dashboards_folder]).resolve() == DASHBOARD.parent
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_folder}/{DASHBOARD.name}"
    datasource = _load_yaml(DATASOURCES)["datasources"][0]
    host_port = datasource["url"].removeprefix("http://")
    assert host_port == "prometheus:9090"
    assert "127.0.0.1:9090:9090" in services["prometheus"]["ports"]
    assert services["grafana"]["depends_on"] == ["prometheus"]


@pytest.mark.parametrize("path", [PROMETHEUS, DATASOURCES, DASHBOARD_PROVIDERS])
def test_provisioning_files_parse(path: Path) -> None:
    assert isinstance(_load_yaml(path), dict)
