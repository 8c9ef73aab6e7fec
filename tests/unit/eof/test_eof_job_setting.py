"""The end-of-stream agents' jobs are a setting without a default: none named is refused at start, naming the setting;
several may be named, each under a name of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from examples.eof_orders import JOB_SETTING, ORDERS
from tests.conftest import ROOT
from weir.app.eof_topology import load_job, parse_jobs


def test_no_job_is_refused_with_the_setting_named() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WEIR_AGENTS": "eof_filter",
        "WEIR_EOF_JOB": "",
        "WEIR_DATA_DIR": str(ROOT / ".weir" / "unit-eof-job"),
    }
    done = subprocess.run([sys.executable, "-c", "import app.main"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "setting WEIR_EOF_JOB is not set: the eof_* agents run the end-of-stream job(s) it names" in done.stderr


def test_a_named_job_is_loaded() -> None:
    assert load_job(JOB_SETTING) is ORDERS


def test_a_name_that_is_no_job_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("setting WEIR_EOF_JOB='examples.eof_orders:HOURS': expected 'module:NAME' naming")):
        load_job("examples.eof_orders:HOURS")


def test_several_jobs_each_under_its_name_and_one_unnamed_at_most() -> None:
    assert parse_jobs("") == []
    assert parse_jobs("a.b:C") == [("", "a.b:C")]
    assert parse_jobs(" words=a.b:W , a.b:C,sums=x:S ") == [("words", "a.b:W"), ("", "a.b:C"), ("sums", "x:S")]
    with pytest.raises(ValueError, match=re.escape("job(s) ['(unnamed)'] named twice")):
        parse_jobs("a.b:C,x:D")
    with pytest.raises(ValueError, match=re.escape("job(s) ['w'] named twice")):
        parse_jobs("w=a.b:C,w=x:D")
    with pytest.raises(ValueError, match="job name 'w s' may hold letters, digits"):
        parse_jobs("w s=a.b:C")
