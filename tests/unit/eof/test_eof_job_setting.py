"""The end-of-stream agents' job is a setting without a default: none named is refused at start, naming the setting."""

from __future__ import annotations

import re

import pytest

from agents.eof_common import load_job
from examples.eof_orders import JOB_SETTING, ORDERS


def test_no_job_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match=re.escape("setting WEIR_EOF_JOB is not set: the eof_* agents run the end-of-stream job it names")):
        load_job("")


def test_a_named_job_is_loaded() -> None:
    assert load_job(JOB_SETTING) is ORDERS


def test_a_name_that_is_no_job_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("setting WEIR_EOF_JOB='examples.eof_orders:HOURS': expected 'module:NAME' naming")):
        load_job("examples.eof_orders:HOURS")
