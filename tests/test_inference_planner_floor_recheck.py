"""Before the daemon's inference planner calls a budget out of reach, it measures the least
pair once more, with a full window, when that pair's reading is in doubt (its window was
cut short over the budget, or it read more than a pair that draws more): one burst at the
switch must not hold a job idle at a budget the least pair meets. Driven with synthetic
batches and power readings, no emulator (as test_inference_planner_remeasure)."""

from __future__ import annotations

import bisect
import dataclasses
import time

import numpy as np
import pytest
from inference_planner_harness import inference_planner, register_job

from powerd.inference_planner import InferenceJobsPlanner
from powerd.modes import PowerMode
from powerd.optimize.inference import Pair, PairMeasurement, ServePair, least_pair_in_doubt

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
LEAST = Pair(PowerMode(4, 1000, 1, 1000), 1)
BUDGET_W = 9.0  # only g=1 (8.7 W true) meets it
BATCH_S = 0.035


class Model:
    """Batch time 35 ms at every g (the latency goal is met anywhere: only power decides);
    power 7 + 1.75g W (g=1: 8.75 W)."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(float)
        return np.full(len(g), BATCH_S * 1000), 7 + 1.75 * g


class Board:
    """Readings every 5 ms, +-0.1 W: the true draw of the mode applied (7 + 1.75g W, g=1 at
    8.7 W), except during the least pair's first `burst_windows` windows: 12 W."""

    def __init__(self, burst_windows: int):
        self.burst_windows = burst_windows
        self.applied: list[PowerMode] = []
        self.windows: list[tuple[float, PowerMode]] = []  # (start, mode) of each window

    def apply(self, mode: PowerMode) -> None:
        self.applied.append(mode)

    def level(self, t: float) -> float:
        k = bisect.bisect_right([s for s, _ in self.windows], t) - 1
        mode = self.windows[k][1] if k >= 0 else self.applied[-1]
        if mode == LEAST.mode:
            nth = sum(1 for s, m in self.windows[: k + 1] if m == mode)
            return 12.0 if nth <= self.burst_windows else 8.7
        return 7 + 1.75 * mode.gpu_hz

    def power(self, t0: float, t1: float):
        ts = np.arange(t0, t1 + 1e-9, 0.005)
        return [(float(t), self.level(t) + (0.1 if i % 2 else -0.1)) for i, t in enumerate(ts)]


def planner(board: Board) -> InferenceJobsPlanner:
    return inference_planner(MODES, Model(), (1,), apply_mode=board.apply, power=board.power)


def run_until_served(pl: InferenceJobsPlanner, board: Board, limit: int = 10) -> list[str]:
    """Windows of 9 batches back to back until the job is served; the pairs' reasons."""
    seen = []
    for _ in range(limit):
        if pl.window is None:
            return seen
        w = pl.window
        seen.append(("full " if w.full_window else "") + str(w.pair.mode.gpu_hz))
        t0 = time.monotonic() + 0.001
        board.windows.append((t0, w.pair.mode))
        starts = t0 + BATCH_S * np.arange(9)
        pl.feed("j1", list(starts + BATCH_S), [BATCH_S] * len(starts))
        pl.tick(t0 + 9 * BATCH_S + 0.01)
    raise AssertionError(f"still measuring after {seen}")


def register(pl: InferenceJobsPlanner) -> None:
    register_job(pl, BUDGET_W, rate_hz=10.0, latency_ms=200.0)


@pytest.mark.parametrize("bursts, served_within", [(1, True), (5, False)])
def test_the_least_pair_is_measured_again_before_a_budget_is_called_out_of_reach(
    bursts, served_within
):
    board = Board(burst_windows=bursts)
    pl = planner(board)
    register(pl)
    seen = run_until_served(pl, board)
    served = pl.serving["j1"]
    assert isinstance(served, ServePair)
    assert served.within_budget is served_within, seen
    # one second look, a full window, whatever the board reads then: never a third
    assert seen.count("full 1") == 1, seen
    if served_within:
        assert served.pair == LEAST and served.feasible
        assert pl.jobs["j1"].samples[LEAST].power_w == pytest.approx(8.7, abs=0.05)
        assert not pl.jobs["j1"].samples[LEAST].stopped
    else:
        assert pl.phase_of("j1").phase == "idle"


def test_a_least_pair_read_as_it_should_is_not_doubted():
    m = PairMeasurement(LEAST, 35.0, 9.5, None, 9, 0.1, 40)
    higher = PairMeasurement(Pair(PowerMode(4, 1000, 2, 1000), 1), 35.0, 10.5, None, 9, 0.1, 40)
    assert not least_pair_in_doubt({LEAST: m, higher.pair: higher}, LEAST)
    assert least_pair_in_doubt(
        {LEAST: dataclasses.replace(m, power_w=11.2), higher.pair: higher}, LEAST
    )
    stopped = dataclasses.replace(m, stopped=True)
    assert least_pair_in_doubt({LEAST: stopped}, LEAST)
