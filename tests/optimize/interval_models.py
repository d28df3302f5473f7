"""A four-knob mode space of two levels each and a model of it whose high EMC clock doubles
the speed and reads 7.5 W over: the stand-ins the interval-doubt, long-shot and swap tests
share; and the state of a budget change after its commit, which the floor tests share too."""

from __future__ import annotations

import numpy as np

from powerd.device.modespace import ModeSpace
from powerd.optimize.base import Measurement, Predictor
from powerd.optimize.powertrain import PowerTrain

SPACE = ModeSpace(
    cores=[2, 4],
    cpu_khz=[1_000_000, 2_000_000],
    gpu_hz=[300_000_000, 600_000_000],
    emc_hz=[665_000_000, 2_133_000_000],
)
BUDGET_W = 10.0
HIGH_EMC = 2_133_000_000


def knob_index(modes: np.ndarray) -> np.ndarray:
    """Each knob's index (0 or 1) along its axis."""
    lo = np.array([2, 1_000_000, 300_000_000, 665_000_000])
    return (np.asarray(modes).reshape(-1, 4) > lo).astype(np.float64)


class Model(Predictor):
    """The high EMC clock doubles the speed and, by this model, adds 7.5 W: every mode there
    is predicted 11.5-14 W, over the 10 W budget."""

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = knob_index(modes)
        t = 100.0 / (1.0 + 0.2 * k[:, 1] + k[:, 2]) / (1.0 + k[:, 3])
        p = 4.0 + 0.5 * k[:, 0] + k[:, 1] + k[:, 2] + 7.5 * k[:, 3]
        return t, p


class IntervalModel(Model):
    """... and says it knows the low EMC clock (its samples) well, the high one poorly."""

    def predict_interval(self, modes: np.ndarray):
        t, p = self.predict(modes)
        far = knob_index(modes)[:, 3] > 0
        half_p = np.where(far, 6.0, 0.3)
        half_t = np.where(far, 0.3, 0.03)
        return t, t * np.exp(-half_t), t * np.exp(half_t), p, p - half_p, p + half_p


def as_budget_change(strategy, own: dict, fitted: Predictor, budget_w: float = BUDGET_W) -> None:
    """Put a PowerTrain where a budget change at `budget_w` stands once the modes of `own`
    are measured and `fitted` was fitted to them: a few modes of room left, and the model's
    recorded power misses small (0.1 W)."""
    strategy._budget, strategy._first = budget_w, False
    strategy._limit = len(own) + 4
    strategy.on_fitted(fitted)
    strategy._fitted_on = frozenset(own)
    strategy._scored = set(own)
    strategy._misses_p = [0.1] * 12


def committed_low_emc(fitted: Predictor, **tuning: float):
    """(PowerTrain, its samples): a budget change at BUDGET_W after its commit, every
    low-EMC mode measured as Model predicts (all fit), the high-EMC ones (predicted twice
    as fast at 11.5-14 W, over the budget) never measured; `fitted` the fit at hand."""
    strategy = PowerTrain(SPACE, lambda: Model(), max_modes=50, rehearse_modes=0, **tuning)
    assert strategy._reference_ready()
    t, p = Model().predict(strategy.modes_array)
    own = {
        mode: Measurement(mode, float(t[i]), float(p[i]))
        for i, mode in enumerate(strategy.mode_list)
        if mode.emc_hz != HIGH_EMC
    }
    as_budget_change(strategy, own, fitted)
    return strategy, own
