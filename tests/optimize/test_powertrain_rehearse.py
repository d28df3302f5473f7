"""The first budget rehearses lower budgets after its own refine picks (PowerTrain._rehearse):
while its room lasts, the job measures the modes refine would pick under budgets 1 W apart
below its own, so a later set_budget to the bottom of the range finds the model fitted there.
Replayed on MobileNet v3 training with the stand-in predictors."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import Action, Measure, Measurement, Predictor, Strategy
from powerd.optimize.powertrain import PowerTrain
from powerd.sim.trace import Trace
from powerd_replay.training import GridSpace, NoiseModel, NoisyOracle, RidgeFitter, replay_sweep

HIGH, LOW = 35.0, 16.0


class Rehearsals(Strategy):
    """Passes through; records each mode refine measures as a rehearsal (budget, mode, the
    corrected power prediction then) and the modes measured per budget."""

    def __init__(self, inner: PowerTrain):
        self.inner = inner
        self.name = inner.name
        self.rehearsed: list[tuple[float, PowerMode, float]] = []
        self.refined: list[tuple[float, PowerMode]] = []
        self.new: dict[float, list[PowerMode]] = {}

    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        action = self.inner.next_action(budget_w, samples)
        if isinstance(action, Measure) and action.mode not in samples:
            self.new.setdefault(budget_w, []).append(action.mode)
        return action

    def refine(self, budget_w, samples, room):
        own = {k: v for k, v in samples.items() if k in self.inner.index}
        _, p, _, _ = self.inner._corrected(own)
        before = self.inner._rehearsed
        action = self.inner.refine(budget_w, samples, room)
        if action is not None and action.mode not in samples:
            self.new.setdefault(budget_w, []).append(action.mode)
            self.refined.append((budget_w, action.mode))
            if self.inner._rehearsed > before:
                predicted = float(p[self.inner.index[action.mode]])
                self.rehearsed.append((budget_w, action.mode, predicted))
        return action

    def on_fitted(self, predictor: Predictor) -> None:
        self.inner.on_fitted(predictor)


def sweep(trace: Trace, budgets, seed: int = 0, **tuning):
    oracle = NoisyOracle(trace, time_err=0.10, power_err=0.05, jitter=0.02, seed=seed)
    fitter = RidgeFitter(oracle, [trace.axis(f) for f in FIELDS])
    watch = Rehearsals(PowerTrain(GridSpace.from_trace(trace), lambda: oracle, **tuning))
    res = replay_sweep(
        watch, trace, budgets, fitter=fitter, noise=NoiseModel(seed=seed), refine_room=60
    )
    return watch, res


@pytest.fixture(scope="module")
def rehearsed(mobilenet: Trace):
    return sweep(mobilenet, [HIGH, LOW])


def test_a_high_first_budget_measures_modes_for_lower_budgets(rehearsed, mobilenet) -> None:
    watch, res = rehearsed
    cap = watch.inner.cfg.rehearse_modes
    assert 2 <= len(watch.rehearsed) <= cap
    for budget, _, predicted_w in watch.rehearsed:
        assert budget == HIGH  # the first budget only, never a change
        assert predicted_w <= HIGH - 1.0  # picked under a budget at least 1 W lower
    # spread over the range below the budget, not bunched under it
    powers = sorted(mobilenet.lookup(m).power_w for _, m, _ in watch.rehearsed)
    assert powers[-1] - powers[0] >= 5.0, powers
    # within the first budget's room; the change keeps its own
    assert len(watch.new[HIGH]) <= 50
    assert len(watch.new.get(LOW, [])) <= watch.inner.cfg.change_modes + 1


def test_rehearsals_are_measured_as_any_mode_and_never_pinned_over_the_budget(
    rehearsed, mobilenet
) -> None:
    watch, res = rehearsed
    assert res.false_commits == 0
    for row in res.rows:
        assert row.feasible and mobilenet.lookup(row.mode).power_w <= row.budget_w + 0.5


def test_the_low_budget_change_finds_measured_modes_that_fit(rehearsed, mobilenet) -> None:
    """What rehearsing is for: when the budget drops, modes near the front under it were
    measured already, so the change's few picks start from a model fitted there."""
    watch, _ = rehearsed
    low_ones = [m for _, m, _ in watch.rehearsed if mobilenet.lookup(m).power_w <= LOW]
    assert low_ones, "no rehearsal measured a mode that fits the low budget"


@pytest.mark.parametrize("cap", [0, 2])
def test_rehearse_modes_caps_the_rehearsals(mobilenet: Trace, cap: int) -> None:
    watch, _ = sweep(mobilenet, [HIGH], rehearse_modes=cap)
    assert len(watch.rehearsed) == cap


def test_rehearsals_keep_to_the_first_budgets_room(mobilenet: Trace) -> None:
    watch, _ = sweep(mobilenet, [HIGH], max_modes=20)
    assert len(watch.new[HIGH]) <= 20


def test_a_first_budget_at_the_bottom_of_the_range_has_nothing_to_rehearse(
    mobilenet: Trace,
) -> None:
    low = min(r.power_w for r in mobilenet.rows) + 0.5
    watch, _ = sweep(mobilenet, [low])
    assert not watch.rehearsed


def test_no_finite_power_prediction_no_rehearsal(mobilenet: Trace, monkeypatch) -> None:
    """A model that predicts no finite power anywhere rehearses nothing (and does not fail)."""
    watch, _ = sweep(mobilenet, [HIGH], rehearse_modes=50)
    strategy = watch.inner
    n = len(strategy.mode_list)
    nan = np.full(n, np.nan)
    monkeypatch.setattr(strategy, "_corrected", lambda own: (nan, nan, nan, nan))
    assert strategy._rehearse(HIGH, {}) is None
