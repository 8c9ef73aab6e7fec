"""The outline sent in place of a result too large to send always fits a record, whatever the group lacked."""

from __future__ import annotations

import hashlib

from weir.app.aggregation import OUTLINE_SAMPLE, dead_lettered_result
from weir.app.codec import dumps
from weir.app.runtime.keyed import Output, Undeliverable

LIMIT = 1_000_000


def test_a_group_missing_hundreds_of_thousands_of_items_still_gets_an_outline_that_fits() -> None:
    missing = list(range(300_000))
    failed = list(range(300_000, 310_000))
    result = {
        "correlation_id": "o-1",
        "aggregator": "orders",
        "status": "partial",
        "reason": "timeout",
        "missing": missing,
        "failed": failed,
    }
    assert len(dumps(result)) > LIMIT, "the full result is over a record: the case at hand"
    failure = Undeliverable(Output(None, "o-1", result), "over the record limit", size_bytes=len(dumps(result)), sha256="ab" * 32)
    outline = dead_lettered_result(result, failure)
    assert len(dumps(outline)) < 10_000
    assert (outline["status"], outline["completed_status"], outline["reason"]) == ("dead-lettered", "partial", "timeout")
    assert (outline["missing"], outline["missing_count"]) == (missing[:OUTLINE_SAMPLE], 300_000)
    assert outline["missing_sha256"] == hashlib.sha256(dumps(missing)).hexdigest()
    assert (outline["failed"], outline["failed_count"]) == (failed[:OUTLINE_SAMPLE], 10_000)


def test_a_short_list_is_whole_in_the_outline() -> None:
    result = {"correlation_id": "o-2", "status": "partial", "missing": [3, 7], "failed": []}
    outline = dead_lettered_result(result, Undeliverable(Output(None, "o-2", result), "too large"))
    assert (outline["missing"], outline["missing_count"], outline["failed"], outline["failed_count"]) == ([3, 7], 2, [], 0)
