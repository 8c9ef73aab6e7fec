"""A/B in one run: `python -m bench.ab BASE [--only weir-inline] [--rounds 3] [--orders N]`.

What a change buys, measured fairly on a shared machine: ``bench.compare`` runs the same sections on two
checkouts, the commit ``BASE`` (a temporary git worktree) and this working tree, alternately (A, B, A, B, ...),
one run each time, against the same broker. Alternating spreads whatever else the machine does over both
sides. CPU per order (all worker processes' utime+stime over the backlog, divided by the orders) is the figure
to read first: it depends little on the machine's load, while orders/s and latency do. Prints each round
and the medians; nothing is written into bench/.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent

#: The figures compared: bench.compare's figure names that start with "backlog of" and end with one of these.
FIGURES = ("orders/s", "CPU per order, the workers", "records/s", "CPU per record, the worker")
#: The sections' backlog figures start so: the split/aggregate pipelines', the windows'.
BACKLOGS = ("backlog of", "tumbling window")


def _checkout(base: str, into: Path) -> Path:
    tree = into / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), base], check=True)
    venv = ROOT / ".venv"
    if venv.exists():
        (tree / ".venv").symlink_to(venv)
    return tree


def _run(tree: Path, only: str, orders: int, output: Path) -> list[dict[str, object]]:
    command = [sys.executable, "-m", "bench.compare", "--only", only, "--runs", "1", "--orders", str(orders), "--output", str(output)]
    with output.with_suffix(".log").open("wb") as log:
        subprocess.run(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT, check=True)
    figures: list[dict[str, object]] = orjson.loads(output.with_suffix(".json").read_bytes())["figures"]
    return figures


def _pick(figures: list[dict[str, object]]) -> dict[tuple[str, str], float]:
    """Per (system, figure name): the one run's value, for the backlog figures of :data:`FIGURES`."""
    picked: dict[tuple[str, str], float] = {}
    for figure in figures:
        name, values = str(figure["name"]), figure["values"]
        if name.startswith(BACKLOGS) and name.endswith(FIGURES) and isinstance(values, list) and values:
            picked[(str(figure["system"]), name.split(": ", 1)[-1])] = float(values[0])
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the commit to compare this working tree with (A)")
    parser.add_argument("--only", default="weir-inline", help="bench.compare sections (default weir-inline)")
    parser.add_argument("--rounds", type=int, default=3, help="A/B rounds (default 3)")
    parser.add_argument("--orders", type=int, default=4000, help="bench.compare --orders (the inline backlog is 5 times this)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weir-ab-") as temp:
        work = Path(temp)
        base = _checkout(args.base, work)
        sides = {"A": base, "B": ROOT}
        results: dict[str, list[dict[tuple[str, str], float]]] = {"A": [], "B": []}
        try:
            for number in range(1, args.rounds + 1):
                for side, tree in sides.items():
                    picked = _pick(_run(tree, args.only, args.orders, work / f"{side}-{number}.md"))
                    results[side].append(picked)
                    shown = ", ".join(f"{system}: {name} {value:,.3f}" for (system, name), value in sorted(picked.items()))
                    print(f"round {number} {side}: {shown}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    print(f"\nmedians of {args.rounds} alternating runs, A = {args.base}, B = this working tree ({args.only}, --orders {args.orders}):")
    keys = sorted({key for runs in results.values() for picked in runs for key in picked})
    for system, label in keys:
        medians = {side: statistics.median(p[(system, label)] for p in runs if (system, label) in p) for side, runs in results.items()}
        change = (medians["B"] / medians["A"] - 1) * 100 if medians["A"] else float("nan")
        print(f"  {system} | {label} | A {medians['A']:,.3f} | B {medians['B']:,.3f} | {change:+.0f}%")


if __name__ == "__main__":
    main()
