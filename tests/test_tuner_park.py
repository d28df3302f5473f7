"""While the predictor is fitted the board does not stay on a mode measured over the
budget: the tuner parks it on the fastest measured mode within the budget (driven with a
scripted strategy, synthetic steps and a board whose power follows the applied mode; no
daemon)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Fit, Measure, Strategy, best_within
from powerd.profiler import WindowSpec
from powerd.tuner import Tuner, TunerHooks, WorkloadState

SLOW = PowerMode(2, 1000000, 500000000, 2000000000)  # within the budget, the slower one
FAST = PowerMode(4, 1000000, 500000000, 2000000000)  # within the budget, the faster one
HOT = PowerMode(8, 1000000, 500000000, 2000000000)  # far over the budget
BUDGET_W = 12.0


class Scripted(Strategy):
    """Measure `plan` in turn, then ask for one fit, then commit the first mode."""

    name = "scripted"

    def __init__(self, plan: list[PowerMode]):
        self.plan = plan
        self.fit_asked = False

    def next_action(self, budget_w, samples):
        for mode in self.plan:
            if mode not in samples:
                return Measure(mode)
        if not self.fit_asked:
            self.fit_asked = True
            return Fit()
        return Commit(self.plan[0])


STEP_S = {SLOW: 0.008, FAST: 0.004, HOT: 0.002}


class Board:
    """Power (and the job's step time) follows the mode last applied; every switch is
    recorded with its time."""

    def __init__(self, watts: dict[PowerMode, float]):
        self.watts = watts
        self.switches: list[tuple[float, PowerMode]] = []

    def apply(self, mode: PowerMode) -> None:
        self.switches.append((time.monotonic(), mode))

    @property
    def mode(self) -> PowerMode | None:
        return self.switches[-1][1] if self.switches else None

    def power(self, t0: float, t1: float):
        out, t = [], t0
        while t <= t1:
            mode = None
            for at, m in self.switches:
                if at <= t:
                    mode = m
            out.append((t, self.watts.get(mode, 5.0)))
            t += 0.005
        return out


def _tuner(board: Board, plan: list[PowerMode]) -> tuple[Tuner, list[Future]]:
    fits: list[Future] = []

    def submit(w):
        fits.append(Future())
        return fits[-1]

    spec = WindowSpec(settle_s=0.02, window_s=0.1, min_steps=3)
    hooks = TunerHooks(
        apply_mode=board.apply,
        power=board.power,
        submit_fit=submit,
        on_sample=lambda w: None,
        on_commit=lambda m, s: None,
    )
    return Tuner(WorkloadState("w", "training", Scripted(plan)), BUDGET_W, spec, hooks), fits


def _run(t: Tuner, board: Board, until, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        time.sleep(0.005)
        now = time.monotonic()
        t.feed_steps([now], [STEP_S.get(board.mode, 0.005)])
        t.tick(now)
    assert until(), f"gave up in state {t.state}"


def test_a_mode_stopped_over_the_budget_is_left_for_the_fastest_within_it_while_fitting():
    board = Board({SLOW: 9.0, FAST: 11.0, HOT: 16.0})
    t, fits = _tuner(board, [SLOW, FAST, HOT])
    _run(t, board, lambda: t.state == "fitting")
    hot = t.workload.samples[HOT]
    assert hot.aborted_over_budget and hot.power_w > BUDGET_W + 1.0
    # the fit runs on the fastest mode measured within the budget, not on HOT nor SLOW
    assert board.mode == FAST, board.switches
    assert t.phase == "fitting"
    time.sleep(0.05)  # the fit takes a while
    seconds_before = t.workload.cost.seconds
    above_before = t.workload.cost.seconds_above_budget
    fits[0].set_result(None)
    _run(t, board, lambda: t.state == "tuned")
    assert board.mode == SLOW  # the scripted commit
    # the fit's 50 ms count as profiling time, none of it over the budget
    assert t.workload.cost.seconds - seconds_before >= 0.04
    assert t.workload.cost.seconds_above_budget == above_before


def test_a_fit_after_a_mode_within_the_budget_switches_nothing():
    board = Board({SLOW: 9.0, FAST: 11.0})
    t, fits = _tuner(board, [FAST, SLOW])
    _run(t, board, lambda: t.state == "fitting")
    assert [m for _, m in board.switches] == [FAST, SLOW]


def test_with_nothing_within_the_budget_the_least_power_mode_measured_holds_the_board():
    board = Board({SLOW: 13.6, HOT: 16.0})
    t, fits = _tuner(board, [SLOW, HOT])
    _run(t, board, lambda: t.state == "fitting")
    assert not any(s.power_w <= BUDGET_W for s in t.workload.samples.values())
    assert board.mode == SLOW, board.switches


def test_a_fit_without_a_measured_mode_to_fall_back_on_leaves_the_board_as_it_is():
    board = Board({HOT: 16.0})
    t, fits = _tuner(board, [HOT])
    _run(t, board, lambda: t.state == "fitting")
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
    t, fits = _tuner(board, [SLOW, FAST])
    t.workload.strategy = RefitOnChange([SLOW, FAST])
    _run(t, board, lambda: t.state == "fitting")
    fits[-1].set_result(None)
    _run(t, board, lambda: t.state == "tuned")
    assert board.mode == FAST  # the fastest within 12 W
    t.set_budget(10.0)  # FAST (11 W) no longer fits
    _run(t, board, lambda: t.state == "fitting")
    assert board.mode == SLOW, board.switches
    fits[-1].set_result(None)
    _run(t, board, lambda: t.state == "tuned")
    assert board.mode == SLOW
