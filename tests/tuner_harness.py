"""A tuner driven without a daemon: a scripted strategy, synthetic steps and a board whose
power follows the applied mode (shared by the tuner's park and guard tests)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Fit, Measure, Strategy
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


def make_tuner(board: Board, plan: list[PowerMode]) -> tuple[Tuner, list[Future]]:
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


def run_until(t: Tuner, board: Board, until, seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        time.sleep(0.005)
        now = time.monotonic()
        t.feed_steps([now], [STEP_S.get(board.mode, 0.005)])
        t.tick(now)
    assert until(), f"gave up in state {t.state}"
