"""powertrain's interval doubt (Tuning.interval_doubt_time/_power; time on by default, power
off): a region the samples never reached, whose fitted interval is wide, may be measured
when the point prediction alone says it cannot fit or cannot gain; off, or without
intervals, the pick is unchanged."""

from __future__ import annotations

import numpy as np
from interval_models import BUDGET_W, SPACE, IntervalModel, Model, knob_index

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.optimize.powertrain import PowerTrain


def pick(
    fitted: Predictor, z_power: list[float] | None = None, first: bool = False, **tuning: float
) -> PowerMode | None:
    """The pick under BUDGET_W with every low-EMC mode measured as predicted (all fit), in a
    budget change (`first`: the workload's first budget, before its commit); `z_power`: the
    model's recorded power misses, in sds of its interval."""
    strategy = PowerTrain(SPACE, lambda: Model(), max_modes=50, **tuning)
    strategy._first = first
    strategy._z_p = list(z_power or [])
    assert strategy._reference_ready()
    own = {}
    t, p = Model().predict(strategy.modes_array)
    for i, mode in enumerate(strategy.mode_list):
        if mode.emc_hz == 665_000_000:
            own[mode] = Measurement(mode, float(t[i]), float(p[i]))
    strategy.on_fitted(fitted)
    strategy._fitted_on = frozenset(own)
    k = strategy._pick(BUDGET_W, own)
    return None if k is None else strategy.mode_list[k]


def test_power_doubt_is_off_by_default_the_point_prediction_rules_out_the_region() -> None:
    assert pick(IntervalModel()) is None


class SlowLookingModel(Model):
    """The high EMC clock read 30 % *slower* and 1.5 W more (under the budget): the refit
    learnt it from one sample at a corner where memory does not matter. Its time interval
    there is wide: no sample near it says how fast it is."""

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = knob_index(modes)
        t = 100.0 / (1.0 + 0.2 * k[:, 1] + k[:, 2]) * (1.0 + 0.3 * k[:, 3])
        p = 4.0 + 0.5 * k[:, 0] + k[:, 1] + k[:, 2] + 1.5 * k[:, 3]
        return t, p

    def predict_interval(self, modes: np.ndarray):
        t, p = self.predict(modes)
        half_t = np.where(knob_index(modes)[:, 3] > 0, 0.8, 0.03)
        return t, t * np.exp(-half_t), t * np.exp(half_t), p, p - 0.3, p + 0.3


def test_by_default_a_wide_time_interval_gets_a_region_that_looks_slow_measured() -> None:
    mode = pick(SlowLookingModel())
    assert mode is not None and mode.emc_hz == 2_133_000_000
    assert pick(SlowLookingModel(), interval_doubt_time=0.0) is None


def test_a_wide_interval_gets_the_unexplored_region_measured() -> None:
    mode = pick(IntervalModel(), interval_doubt_time=1.0, interval_doubt_power=1.0)
    assert mode is not None and mode.emc_hz == 2_133_000_000


def test_scope_1_leaves_the_first_budgets_picks_before_its_commit_alone() -> None:
    on = {"interval_doubt_time": 1.0, "interval_doubt_power": 1.0}
    assert pick(IntervalModel(), first=True, **on) is None
    mode = pick(IntervalModel(), first=True, interval_scope=0, **on)
    assert mode is not None and mode.emc_hz == 2_133_000_000


def test_without_intervals_the_option_changes_nothing() -> None:
    assert pick(Model(), interval_doubt_time=1.0, interval_doubt_power=1.0) is None


def test_calibrated_intervals_shrink_when_the_misses_were_far_inside_them() -> None:
    """interval_calibrate: the recorded power misses were a tenth of the interval's sd, so
    the interval is read ~0.4x as wide and the high-EMC modes are too unlikely to fit; misses
    of 1 sd keep the interval as stated."""
    on = {"interval_doubt_time": 1.0, "interval_doubt_power": 1.0}  # calibrated by default
    assert pick(IntervalModel(), z_power=[0.1] * 12, **on) is None
    mode = pick(IntervalModel(), z_power=[1.0] * 12, **on)
    assert mode is not None and mode.emc_hz == 2_133_000_000
    # uncalibrated, the same record changes nothing
    on["interval_calibrate"] = 0
    mode = pick(IntervalModel(), z_power=[0.1] * 12, **on)
    assert mode is not None and mode.emc_hz == 2_133_000_000
