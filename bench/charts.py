"""PNG charts of bench.compare's figures: `python -m bench.charts [bench/results.json] [--out bench/charts]`.

Reads the JSON bench.compare writes beside bench/results.md and draws, for the systems that ran the
split/aggregate pipeline (weir, weir with the items inline, Quix Streams inline, in chunks and per item), those
doing the same work (a figure's ``work``) side by side:

- ``throughput.png``: orders/s of the backlog run (median, min-max as error bars), and the CPU each order cost
  in that run (the median of the figures "CPU per order, the workers" and "..., the broker"; in a file without
  them, the median run's processes' CPU / its orders/s; the harness left out);
- ``latency.png``: latency p50 and p99 against the offered rate (the fixed rate, and half the backlog rate as
  it was actually offered), median with min-max as error bars.

A chart whose figures are not in the file (a run with ``--only``) is skipped with a line saying so; a file
that is not bench.compare's figures is refused.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FIGURES_FORMAT", "FiguresError", "BenchFigure", "load_figures", "throughput_chart", "latency_chart", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: The "format" of bench/results.json, written by bench.compare; any other is refused.
FIGURES_FORMAT = "weir-bench-figures/1"
DEFAULT_FIGURES = ROOT / "bench" / "results.json"
DEFAULT_OUT = ROOT / "bench" / "charts"

_BACKLOG_ORDERS = re.compile(r"^backlog of (?P<orders>[\d,]+) orders: orders/s$")
_CPU_PER_ORDER = re.compile(r"^backlog of (?P<orders>[\d,]+) orders: CPU per order, the (?P<whose>workers|broker)$")
_OFFERED_LATENCY = re.compile(r"^offered (?P<rate>.+?) for (?P<seconds>[\d.]+) s: latency (?P<percentile>p\d+)$")
_FIXED_RATE = re.compile(r"^(?P<rate>[\d.,]+) orders/s$")
#: Processes of a figure's CPU that are not the system measured: the harness (producer and reading consumer).
HARNESS = "bench"
BROKER = "broker"


class FiguresError(ValueError):
    """The figures file is not what bench.compare writes."""


@dataclass(frozen=True)
class BenchFigure:
    """One row of the table, in numbers: min / median / max over the runs and the median run's CPU (% of one core)."""

    system: str
    name: str
    unit: str
    minimum: float
    median: float
    maximum: float
    median_cpu: dict[str, float]
    #: The split/aggregate work the row measures (bench.compare's WORK_*); empty for other rows and in older files.
    work: str = ""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_figures(path: Path) -> list[BenchFigure]:
    """The figures of a bench/results.json; rows without a value (a figure no run produced) are left out."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        message = f"figures file {path}: cannot read it as JSON ({error})"
        raise FiguresError(message) from error
    if not isinstance(data, dict) or data.get("format") != FIGURES_FORMAT or not isinstance(data.get("figures"), list):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        message = f"figures file {path}: expected an object with format {FIGURES_FORMAT!r} and a 'figures' list, found {found!r}"
        raise FiguresError(message)
    figures = []
    for number, row in enumerate(data["figures"], start=1):
        where = f"figures file {path}: figure {number}"
        if not isinstance(row, dict) or not all(isinstance(row.get(key), str) for key in ("system", "name", "unit")):
            message = f"{where}: expected an object with text 'system', 'name' and 'unit', found {row!r}"
            raise FiguresError(message)
        where += f" ({row['system']}: {row['name']})"
        if not row.get("values"):
            continue
        if not all(_number(row.get(key)) for key in ("min", "median", "max")):
            message = f"{where}: expected numbers 'min', 'median' and 'max', found {[row.get(key) for key in ('min', 'median', 'max')]!r}"
            raise FiguresError(message)
        cpu = row.get("median_cpu")
        if not isinstance(cpu, dict) or not all(isinstance(name, str) and _number(percent) for name, percent in cpu.items()):
            message = f"{where}: expected 'median_cpu' as an object of process name -> % of one core, found {cpu!r}"
            raise FiguresError(message)
        work = row.get("work", "")
        if not isinstance(work, str):
            message = f"{where}: expected 'work' as text, found {work!r}"
            raise FiguresError(message)
        figures.append(BenchFigure(row["system"], row["name"], row["unit"], row["min"], row["median"], row["max"], dict(cpu), work))
    return figures


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (no display needed); imported here so bench.compare needs no matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _systems(figures: list[BenchFigure]) -> list[str]:
    """Systems in the order the table lists them, those of the same work next to each other."""
    systems = list(dict.fromkeys(figure.system for figure in figures))
    work = {figure.system: figure.work for figure in figures}
    works = list(dict.fromkeys(work[system] for system in systems))
    return sorted(systems, key=lambda system: works.index(work[system]))


def _cpu_per_order(figures: list[BenchFigure], row: BenchFigure) -> tuple[float, float]:
    """ms of one core per order of a backlog run: the system's processes', the broker's (the measured figures, or derived)."""
    measured = {
        found.group("whose"): figure.median
        for figure in figures
        if figure.system == row.system and (found := _CPU_PER_ORDER.match(figure.name))
    }
    # % of one core / orders per second = core-seconds per order (x10 for ms): what one order cost each process.
    own = sum(p for name, p in row.median_cpu.items() if name not in (HARNESS, BROKER)) * 10 / row.median
    broker = row.median_cpu.get(BROKER, 0.0) * 10 / row.median
    return measured.get("workers", own), measured.get("broker", broker)


def _error_bars(figures: list[BenchFigure]) -> list[list[float]]:
    return [[figure.median - figure.minimum for figure in figures], [figure.maximum - figure.median for figure in figures]]


def throughput_chart(figures: list[BenchFigure], path: Path) -> bool:
    """Orders/s of each system's backlog run and CPU per order (ms of one core); False if no backlog run is in the figures."""
    backlog = {figure.system: figure for figure in figures if _BACKLOG_ORDERS.match(figure.name) and figure.median > 0}
    if not backlog:
        return False
    systems = [system for system in _systems(figures) if system in backlog]
    rows = [backlog[system] for system in systems]
    own, broker = (list(costs) for costs in zip(*(_cpu_per_order(figures, row) for row in rows), strict=True))
    plt = _pyplot()
    fig, (rate_axis, cpu_axis) = plt.subplots(1, 2, figsize=(11, 4.5))
    positions = list(range(len(systems)))
    rate_axis.bar(positions, [row.median for row in rows], yerr=_error_bars(rows), capsize=4, color="tab:blue")
    rate_axis.set_title("Throughput, backlog runs (like with like side by side)")
    rate_axis.set_ylabel("orders/s (median, min-max)")
    cpu_axis.bar(positions, own, label="the system's processes", color="tab:orange")
    cpu_axis.bar(positions, broker, bottom=own, label="broker", color="tab:gray")
    cpu_axis.set_title("CPU per order (median run; harness excluded)")
    cpu_axis.set_ylabel("ms of one core per order")
    cpu_axis.set_ylim(0, 1.3 * max(mine + theirs for mine, theirs in zip(own, broker, strict=True)))  # room for the legend
    cpu_axis.legend(loc="upper right")
    for axis in (rate_axis, cpu_axis):
        axis.set_xticks(positions, systems, rotation=20, ha="right", fontsize="small")
        axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _offered_rate(figures: list[BenchFigure], system: str, rate: str, seconds: str) -> float | None:
    """orders/s of an offered-rate run: the number in its name, or the 'rate offered' figure of a relative one."""
    fixed = _FIXED_RATE.match(rate)
    if fixed:
        return float(fixed.group("rate").replace(",", ""))
    offered = f"offered {rate} for {seconds} s: rate offered"
    return next((figure.median for figure in figures if figure.system == system and figure.name == offered), None)


def latency_chart(figures: list[BenchFigure], path: Path) -> bool:
    """Latency percentiles per offered rate, a line per system and percentile; False if no offered-rate run is in the figures."""
    points: dict[tuple[str, str], list[tuple[float, BenchFigure]]] = {}
    for figure in figures:
        found = _OFFERED_LATENCY.match(figure.name)
        if not found:
            continue
        rate = _offered_rate(figures, figure.system, found.group("rate"), found.group("seconds"))
        if rate is not None:
            points.setdefault((figure.system, found.group("percentile")), []).append((rate, figure))
    if not points:
        return False
    plt = _pyplot()
    from matplotlib import ticker

    fig, axis = plt.subplots(figsize=(9, 5))
    drawn = {system for system, _ in points}
    colors = {system: f"C{number}" for number, system in enumerate(system for system in _systems(figures) if system in drawn)}
    for (system, percentile), series in sorted(points.items(), key=lambda item: (list(colors).index(item[0][0]), item[0][1])):
        series.sort(key=lambda point: point[0])
        rows = [row for _, row in series]
        axis.errorbar(
            [rate for rate, _ in series],
            [row.median for row in rows],
            yerr=_error_bars(rows),
            label=f"{system} {percentile}",
            color=colors[system],
            linestyle="-" if percentile == "p50" else "--",
            marker="o",
            capsize=3,
        )
    axis.set_xscale("log")
    axis.set_yscale("log")
    for scale in (axis.xaxis, axis.yaxis):  # plain numbers (20, 400, 1000) rather than powers of ten
        scale.set_major_formatter(ticker.ScalarFormatter())
        scale.set_minor_formatter(ticker.NullFormatter())
    axis.set_xlabel("offered rate, orders/s")
    axis.set_ylabel("latency, ms (median, min-max)")
    axis.set_title("Latency per offered rate (order sent -> result read, read_committed)")
    axis.grid(which="both", alpha=0.3)
    axis.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figures", nargs="?", type=Path, default=DEFAULT_FIGURES, help="bench.compare's JSON (bench/results.json)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the PNGs (bench/charts)")
    args = parser.parse_args(argv)
    try:
        figures = load_figures(args.figures)
    except FiguresError as error:
        print(f"charts: {error}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, draw, needs in (
        ("throughput.png", throughput_chart, "a split/aggregate backlog run (--only weir, weir-inline or quix)"),
        ("latency.png", latency_chart, "a split/aggregate offered-rate run (--only weir, weir-inline or quix)"),
    ):
        path = args.out / name
        if draw(figures, path):
            print(f"charts: wrote {path}")
        else:
            print(f"charts: {name} skipped: {args.figures} has no figures of {needs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
