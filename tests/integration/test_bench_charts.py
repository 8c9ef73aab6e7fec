"""`make bench QUICK=1`'s charts, for real: bench.compare's weir pipeline on a small load, then bench.charts, into a temp dir.

The PNGs must be PNGs that matplotlib reads back at the size bench.charts draws them; the repository's own
bench/results.* and bench/charts/ are not touched.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib import image

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: (width, height) in pixels: bench.charts' figure sizes (inches) at its 110 dpi.
EXPECTED_SIZES = {"throughput.png": (1210, 495), "latency.png": (990, 550)}


def _repository_outputs() -> dict[str, bytes | None]:
    paths = [ROOT / "bench" / "results.md", ROOT / "bench" / "results.json", *sorted((ROOT / "bench" / "charts").glob("*"))]
    return {str(path): path.read_bytes() if path.is_file() else None for path in paths}


def test_bench_compare_then_charts_write_pngs_of_the_drawn_size(kafka_bootstrap: str, tmp_path: Path) -> None:
    before = _repository_outputs()
    results = tmp_path / "results.md"
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "TMPDIR": str(tmp_path)}  # its workers' logs go to tmp_path too
    small = ["--runs", "1", "--orders", "40", "--warm-up", "20", "--light-seconds", "2"]
    compare = [sys.executable, "-m", "bench.compare", "--only", "weir", *small]
    finished = subprocess.run([*compare, "--output", str(results)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert (tmp_path / "results.json").is_file(), "bench.compare writes its figures as JSON beside the markdown"
    charts = tmp_path / "charts"
    drawn = subprocess.run(
        [sys.executable, "-m", "bench.charts", str(tmp_path / "results.json"), "--out", str(charts)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert "skipped" not in drawn.stdout, drawn.stdout
    for name, (width, height) in EXPECTED_SIZES.items():
        raw = (charts / name).read_bytes()
        assert raw[:8] == PNG_SIGNATURE, f"{name} is not a PNG"
        assert raw[12:16] == b"IHDR"
        assert struct.unpack(">II", raw[16:24]) == (width, height), f"{name}: the PNG header's size"
        pixels = image.imread(charts / name)
        assert pixels.shape[:2] == (height, width), f"{name}: read back by matplotlib"
        assert pixels.std() > 0, f"{name}: not a blank image"
    assert _repository_outputs() == before, "the repository's bench/results.* and bench/charts/ are left as they were"
