"""What a restore reads (:func:`app.engine.restore.restore_plan`): the figures of its log line."""

from __future__ import annotations

from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from weir.app.engine.restore import RestorePlan, restore_plan

A, B, C = TP("t-changelog", 0), TP("t-changelog", 1), TP("u-changelog", 0)


def test_a_store_with_nothing_reads_each_changelog_from_its_beginning() -> None:
    assert restore_plan({A: -1, B: -1}, {A: 9, B: 0}) == RestorePlan(records=11, partitions=2, resumed=0)


def test_a_partition_a_standby_kept_reads_only_what_was_written_since() -> None:
    plan = restore_plan({A: 69, B: -1}, {A: 70, B: 118}, standbys={A})
    assert plan == RestorePlan(records=1 + 119, partitions=2, resumed=1, standby=1)
    assert plan.from_beginning == 1
    assert repr(plan) == "120 changelog records in 2 partitions, 1 resumed from a local copy (1 a standby's)"


def test_a_partition_this_worker_owned_resumes_from_its_own_copy() -> None:
    # its store recorded how far the changelog was in it at its last commit (the marker after it is all there is to read)
    plan = restore_plan({A: 69, C: 12}, {A: 70, C: 13}, standbys={B})
    assert plan == RestorePlan(records=2, partitions=2, resumed=2, standby=0)


def test_partitions_with_nothing_to_read_are_not_counted() -> None:
    # up to date (a standby that had read everything), an empty changelog, a partition with no start known
    assert restore_plan({A: 70, B: -1}, {A: 70, B: -1, C: 4}) == RestorePlan(records=5, partitions=1, resumed=0)


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(-1, 50), st.integers(-1, 50))), st.sets(st.integers(0, 7)))
def test_the_records_are_the_offsets_between_start_and_end(bounds: dict[int, tuple[int, int]], standby: set[int]) -> None:
    starts = {TP("t", number): start for number, (start, _) in bounds.items()}
    ends = {TP("t", number): end for number, (_, end) in bounds.items()}
    plan = restore_plan(starts, ends, {TP("t", number) for number in standby})
    behind = [(start, end) for start, end in bounds.values() if end > start]
    assert plan.records == sum(len(range(start + 1, end + 1)) for start, end in behind)
    assert plan.partitions == len(behind)
    assert plan.resumed == sum(1 for start, _ in behind if start >= 0) <= plan.partitions
    assert plan.standby == sum(1 for number, (start, end) in bounds.items() if end > start >= 0 and number in standby) <= plan.resumed
