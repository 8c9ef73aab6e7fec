"""CommitBudget: commits at each pause under a light load, spaced once they take more than their share."""

from __future__ import annotations

from weir.app.engine.commit import CommitBudget


def run(budget: CommitBudget, every_s: float, duration_s: float, count: int) -> list[float]:
    """How long each commit started at a pause had to wait after the last one ended."""
    waits = []
    now = 0.0
    for _ in range(count):
        ended = now + duration_s
        waits.append(budget.next_commit_at(now, ended) - ended)
        now += every_s
    return waits


def test_a_light_load_commits_at_every_pause_even_after_a_slow_commit() -> None:
    budget = CommitBudget(spacing=2.0)
    # 20 commits/s of 4 ms (8% of the time), one of them 30 ms
    assert run(budget, 0.05, 0.004, 40) == [0.0] * 40
    assert budget.next_commit_at(2.0, 2.03) == 2.03


def test_commits_that_take_more_than_a_third_of_the_time_are_spaced_by_twice_their_duration() -> None:
    budget = CommitBudget(spacing=2.0)
    waits = run(budget, 0.025, 0.012, 80)  # 40 commits/s of 12 ms: 48% of the time
    assert waits[0] == 0.0  # the budget of the last second is not spent yet
    assert abs(waits[-1] - 2.0 * 0.012) < 1e-9
    assert sum(1 for wait in waits if wait) > len(waits) // 2


def test_the_window_forgets_old_commits() -> None:
    budget = CommitBudget(spacing=2.0, window_s=1.0)
    run(budget, 0.025, 0.012, 80)
    # a pause of two seconds: the busy second is behind, the next commit comes at once
    assert budget.next_commit_at(10.0, 10.004) == 10.004


def test_one_slow_commit_in_a_busy_second_spaces_the_next_by_twice_the_average_not_twice_itself() -> None:
    budget = CommitBudget(spacing=2.0)
    run(budget, 0.0105, 0.0035, 95)  # 95 commits/s of 3.5 ms: a third of the time, the budget spent
    began = 95 * 0.0105
    ended = began + 0.040  # one commit of 40 ms
    wait = budget.next_commit_at(began, ended) - ended
    assert 0.0 < wait < 0.010  # twice the window's average (about 4 ms), not 80 ms
