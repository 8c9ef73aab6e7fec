"""bench.charts on a small fabricated figures file: it writes non-empty PNGs, skips what is missing, refuses what is malformed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import charts

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
WORK = "three stages, 10 items per record"


def _row(system: str, name: str, unit: str, values: list[float], cpu: dict[str, float], work: str = "") -> dict[str, Any]:
    """A figure as bench.compare writes it (made-up numbers: only their shape matters here)."""
    ordered = sorted(values)
    return ({"work": work} if work else {}) | {
        "system": system,
        "name": name,
        "unit": unit,
        "values": values,
        "cpu": [cpu] * len(values),
        "min": ordered[0],
        "median": ordered[len(ordered) // 2],
        "max": ordered[-1],
        "median_cpu": cpu,
    }


def _fabricated() -> dict[str, Any]:
    rows = [_row("aiokafka", "raw consume", "msg/s", [100.0, 120.0, 110.0], {"broker": 5.0, "bench": 95.0})]
    for system, rate, worker in (("weir", 800.0, "split+agg"), ("Quix Streams", 900.0, "worker")):
        cpu = {"broker": 10.0, worker: 50.0, "bench": 5.0}
        if system == "weir":  # bench.compare's CPU per order figures; Quix's rows are as an older file has them
            rows += [
                _row(system, "backlog of 2,000 orders: CPU per order, the workers", "ms", [0.5, 0.6, 0.7], cpu, WORK),
                _row(system, "backlog of 2,000 orders: CPU per order, the broker", "ms", [0.1, 0.2, 0.3], cpu, WORK),
            ]
        rows += [
            _row(system, "backlog of 2,000 orders: orders/s", "orders/s", [rate - 50, rate, rate + 50], cpu, WORK),
            _row(system, "backlog of 2,000 orders: latency p50", "ms", [900.0, 1000.0, 1100.0], cpu),
            _row(system, "offered 20 orders/s for 10 s: latency p50", "ms", [20.0, 30.0, 40.0], cpu),
            _row(system, "offered 20 orders/s for 10 s: latency p99", "ms", [60.0, 80.0, 90.0], cpu),
            _row(system, "offered half the backlog rate for 10 s: rate offered", "orders/s", [rate / 2] * 3, cpu),
            _row(system, "offered half the backlog rate for 10 s: latency p50", "ms", [100.0, 110.0, 200.0], cpu),
            _row(system, "offered half the backlog rate for 10 s: latency p99", "ms", [200.0, 250.0, 500.0], cpu),
        ]
    rows.append({"system": "weir EOF", "name": "a figure no run produced", "unit": "ms", "values": [], "cpu": []})
    return {"format": charts.FIGURES_FORMAT, "intro": ["command: (fabricated for a unit test)"], "runs": 3, "figures": rows}


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_main_writes_both_charts_as_non_empty_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "charts"
    assert charts.main([str(_write(tmp_path, _fabricated())), "--out", str(out)]) == 0
    for name in ("throughput.png", "latency.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        assert len(data) > 5_000, name
    assert capsys.readouterr().out.count("charts: wrote") == 2


def test_load_figures_reads_numbers_and_leaves_out_rows_without_values(tmp_path: Path) -> None:
    figures = charts.load_figures(_write(tmp_path, _fabricated()))
    assert len(figures) == 17
    backlog = next(figure for figure in figures if figure.system == "weir" and figure.name.endswith("orders/s"))
    assert (backlog.minimum, backlog.median, backlog.maximum) == (750.0, 800.0, 850.0)
    assert backlog.median_cpu == {"broker": 10.0, "split+agg": 50.0, "bench": 5.0}
    assert backlog.work == WORK
    assert next(figure for figure in figures if figure.name == "raw consume").work == ""


def test_cpu_per_order_is_the_measured_figure_or_else_derived_from_the_median_run(tmp_path: Path) -> None:
    figures = charts.load_figures(_write(tmp_path, _fabricated()))
    backlog = {figure.system: figure for figure in figures if figure.name == "backlog of 2,000 orders: orders/s"}
    assert charts._cpu_per_order(figures, backlog["weir"]) == (0.6, 0.2)
    # 50 % of one core at 900 orders/s: 0.5 core-s / 900 orders = 0.556 ms; the broker's 10 %: 0.111 ms
    own, broker = charts._cpu_per_order(figures, backlog["Quix Streams"])
    assert (round(own, 3), round(broker, 3)) == (0.556, 0.111)


def test_half_the_backlog_rate_is_drawn_at_the_rate_actually_offered(tmp_path: Path) -> None:
    figures = charts.load_figures(_write(tmp_path, _fabricated()))
    assert charts._offered_rate(figures, "weir", "half the backlog rate", "10") == 400.0
    assert charts._offered_rate(figures, "weir", "20 orders/s", "10") == 20.0
    assert charts._offered_rate(figures, "weir", "a third of the backlog rate", "10") is None


def test_a_chart_without_its_figures_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _fabricated()
    data["figures"] = [row for row in data["figures"] if row["system"] == "aiokafka"]
    out = tmp_path / "charts"
    assert charts.main([str(_write(tmp_path, data)), "--out", str(out)]) == 0
    assert list(out.iterdir()) == []
    assert capsys.readouterr().out.count("skipped") == 2


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2, 3], "expected an object with format 'weir-bench-figures/1'"),
        ({"format": "something-else/1", "figures": []}, "found 'something-else/1'"),
        ({"format": charts.FIGURES_FORMAT}, "and a 'figures' list"),
        ({"format": charts.FIGURES_FORMAT, "figures": [{"system": "weir", "name": "x"}]}, "figure 1: expected an object with text"),
        (
            {"format": charts.FIGURES_FORMAT, "figures": [{"system": "weir", "name": "x", "unit": "ms", "values": [1], "min": 1}]},
            "figure 1 (weir: x): expected numbers 'min', 'median' and 'max'",
        ),
        (
            {
                "format": charts.FIGURES_FORMAT,
                "figures": [{"system": "weir", "name": "x", "unit": "ms", "values": [1], "min": 1, "median": 1, "max": 1, "median_cpu": 5}],
            },
            "figure 1 (weir: x): expected 'median_cpu' as an object",
        ),
    ],
)
def test_a_malformed_file_is_refused_with_its_place(tmp_path: Path, data: Any, expected: str) -> None:
    with pytest.raises(charts.FiguresError, match=r"figures file .*results\.json") as raised:
        charts.load_figures(_write(tmp_path, data))
    assert expected in str(raised.value)


def test_a_work_that_is_not_text_is_refused(tmp_path: Path) -> None:
    row = {"system": "weir", "name": "x", "unit": "ms", "values": [1], "min": 1, "median": 1, "max": 1, "median_cpu": {}, "work": 3}
    with pytest.raises(charts.FiguresError, match=r"figure 1 \(weir: x\): expected 'work' as text, found 3"):
        charts.load_figures(_write(tmp_path, {"format": charts.FIGURES_FORMAT, "figures": [row]}))


def test_main_refuses_a_file_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "results.json"
    path.write_text("| system | figure |\n", encoding="utf-8")
    assert charts.main([str(path), "--out", str(tmp_path / "charts")]) == 1
    assert "cannot read it as JSON" in capsys.readouterr().err
    assert not (tmp_path / "charts").exists()


def test_main_refuses_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert charts.main([str(tmp_path / "nope.json"), "--out", str(tmp_path / "charts")]) == 1
    assert "nope.json: cannot read it as JSON" in capsys.readouterr().err
