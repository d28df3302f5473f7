"""powertrain after a window cut short under a lower budget (Tuning.abort_doubt_w): its reading
stopped on a high sample, so when it is only a little over the current budget the mode may
fit, and the modes at or above it in every knob must not be pruned for it."""

from __future__ import annotations

import math

import numpy as np

from powerd.device.modespace import ModeSpace
from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Measure, Measurement, Predictor
from powerd.optimize.powertrain import PowerTrain, rank_index

SPACE = ModeSpace(
    cores=[2, 4, 8],
    cpu_khz=[1_000_000, 1_500_000, 2_000_000],
    gpu_hz=[300_000_000, 600_000_000, 900_000_000],
    emc_hz=[665_000_000, 2_133_000_000, 3_199_000_000],
)
AXES = [SPACE.cores, SPACE.cpu_khz, SPACE.gpu_hz, SPACE.emc_hz]
BUDGET_W = 10.0


class GpuBound(Predictor):
    """The step waits on the GPU clock; the GPU draws most of the power."""

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = rank_index(np.asarray(modes).reshape(-1, 4), AXES)
        t = 300.0 - 100.0 * k[:, 2]
        p = 6.0 + 1.5 * k[:, 2] + 0.5 * (k[:, 0] + k[:, 1] + k[:, 3])
        return t.astype(np.float64), p.astype(np.float64)


SLOW = PowerMode(2, 1_000_000, 300_000_000, 665_000_000)  # fits: 6 W, 300 ms
# every mode faster than SLOW is at or above CUT in every knob
CUT = PowerMode(2, 1_000_000, 600_000_000, 665_000_000)


def at_or_above(mode: PowerMode, floor: PowerMode) -> bool:
    return all(a >= b for a, b in zip(mode.as_tuple(), floor.as_tuple(), strict=True))


def change_after_abort(read_w: float, **tuning: float) -> tuple[PowerTrain, Commit | Measure]:
    """A budget change to BUDGET_W whose samples are SLOW and CUT, the latter's window cut
    short under a lower budget with a mean reading of `read_w`."""
    strategy = PowerTrain(
        SPACE, GpuBound, max_modes=50, rehearse_modes=0, explore_fit_prob=0.0, **tuning
    )
    assert strategy._reference_ready()
    own = {
        SLOW: Measurement(SLOW, 300.0, 6.0, 10),
        CUT: Measurement(CUT, math.nan, read_w, 3, aborted_over_budget=True),
    }
    strategy._budget, strategy._first = BUDGET_W, False
    strategy._limit = len(own) + 4
    strategy.on_fitted(GpuBound())
    strategy._fitted_on = frozenset(own)
    strategy._scored = set(own)
    strategy._misses_p = [0.3] * 12
    return strategy, strategy.next_action(BUDGET_W, own)


def test_a_cut_short_reading_just_over_the_budget_prunes_nothing():
    strategy, action = change_after_abort(BUDGET_W + 0.07)
    assert isinstance(action, Measure)
    assert at_or_above(action.mode, CUT)  # the faster modes are still worth a look


def test_without_the_doubt_that_reading_prunes_every_faster_mode():
    strategy, action = change_after_abort(BUDGET_W + 0.07, abort_doubt_w=0.0)
    assert isinstance(action, Commit | Measure)
    assert not at_or_above(action.mode, CUT)


def test_a_reading_well_over_the_budget_still_prunes():
    strategy, action = change_after_abort(BUDGET_W + 1.5)
    assert not at_or_above(action.mode, CUT)
    own = {CUT: Measurement(CUT, math.nan, BUDGET_W + 1.5, 3, aborted_over_budget=True)}
    open_ = strategy._open(BUDGET_W, own)
    for i, m in enumerate(strategy.mode_list):
        if at_or_above(m, CUT):
            assert not open_[i]


def test_a_full_window_over_the_budget_prunes_as_before():
    strategy = PowerTrain(SPACE, GpuBound, max_modes=50, rehearse_modes=0)
    own = {CUT: Measurement(CUT, 200.0, BUDGET_W + 0.07, 10)}
    open_ = strategy._open(BUDGET_W, own)
    assert not any(open_[i] for i, m in enumerate(strategy.mode_list) if at_or_above(m, CUT))
