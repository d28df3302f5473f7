"""While the predictor is fitted the board does not stay on a mode measured over the
budget: the tuner parks it on the fastest measured mode within the budget (driven with a
scripted strategy, synthetic steps and a board whose power follows the applied mode; no
daemon)."""

from __future__ import annotations

import time

from tuner_harness import BUDGET_W, FAST, HOT, SLOW, Board, Scripted, make_tuner, run_until

from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Fit, best_within


def test_a_mode_stopped_over_the_budget_is_left_for_the_fastest_within_it_while_fitting():
    board = Board({SLOW: 9.0, FAST: 11.0, HOT: 16.0})
    t, fits = make_tuner(board, [SLOW, FAST, HOT])
    run_until(t, board, lambda: t.state == "fitting")
    hot = t.workload.samples[HOT]
    assert hot.aborted_over_budget and hot.power_w > BUDGET_W + 1.0
    # the fit runs on the fastest mode measured within the budget, not on HOT nor SLOW
    assert board.mode == FAST, board.switches
    assert t.phase == "fitting"
    time.sleep(0.05)  # the fit takes a while
    seconds_before = t.workload.cost.seconds
    above_before = t.workload.cost.seconds_above_budget
    fits[0].set_result(None)
    run_until(t, board, lambda: t.state == "tuned")
    assert board.mode == SLOW  # the scripted commit
    # the fit's 50 ms count as profiling time, none of it over the budget
    assert t.workload.cost.seconds - seconds_before >= 0.04
    assert t.workload.cost.seconds_above_budget == above_before


def test_a_fit_after_a_mode_within_the_budget_switches_nothing():
    board = Board({SLOW: 9.0, FAST: 11.0})
    t, fits = make_tuner(board, [FAST, SLOW])
    run_until(t, board, lambda: t.state == "fitting")
    assert [m for _, m in board.switches] == [FAST, SLOW]


def test_with_nothing_within_the_budget_the_least_power_mode_measured_holds_the_board():
    board = Board({SLOW: 13.6, HOT: 16.0})
    t, fits = make_tuner(board, [SLOW, HOT])
    run_until(t, board, lambda: t.state == "fitting")
    assert not any(s.power_w <= BUDGET_W for s in t.workload.samples.values())
    assert board.mode == SLOW, board.switches


def test_a_fit_without_a_measured_mode_to_fall_back_on_leaves_the_board_as_it_is():
    board = Board({HOT: 16.0})
    t, fits = make_tuner(board, [HOT])
    run_until(t, board, lambda: t.state == "fitting")
    assert [m for _, m in board.switches] == [HOT]  # nowhere better to go


class RefitOnChange(Scripted):
    """As Scripted, then one more fit for every new budget before committing the fastest
    measured mode within it."""

    def __init__(self, plan: list[PowerMode]):
        super().__init__(plan)
        self.fitted_for: float | None = None

    def next_action(self, budget_w, samples):
        first = super().next_action(budget_w, samples)
        if not isinstance(first, Commit):
            self.fitted_for = budget_w
            return first
        if self.fitted_for != budget_w:
            self.fitted_for = budget_w
            return Fit()
        return Commit(best_within(samples, budget_w).mode)


def test_a_lowered_budget_refits_on_a_mode_within_the_new_budget():
    board = Board({SLOW: 9.0, FAST: 11.0})
    t, fits = make_tuner(board, [SLOW, FAST])
    t.workload.strategy = RefitOnChange([SLOW, FAST])
    run_until(t, board, lambda: t.state == "fitting")
    fits[-1].set_result(None)
    run_until(t, board, lambda: t.state == "tuned")
    assert board.mode == FAST  # the fastest within 12 W
    t.set_budget(10.0)  # FAST (11 W) no longer fits
    run_until(t, board, lambda: t.state == "fitting")
    assert board.mode == SLOW, board.switches
    fits[-1].set_result(None)
    run_until(t, board, lambda: t.state == "tuned")
    assert board.mode == SLOW
