"""tools/bench_prediction.py's `under` design: per budget, only modes the budget admits."""

from __future__ import annotations

import bench_prediction
import numpy as np

from powerd.predictor.transfer import RidgeOptions
from powerd.sim.trace import Trace
from powerd_replay.training import own_range_budgets


def test_under_sets_hold_only_modes_within_their_budget(nano: Trace, reference) -> None:
    k = 12
    sets = bench_prediction.sample_sets(nano, reference, RidgeOptions(), "under", k, seed=0)
    budgets = own_range_budgets(nano)
    assert len(sets) == len(budgets)  # every own-range budget admits at least two modes
    power = {tuple(m): p for m, p in zip(nano.modes_array.tolist(), nano.power_w, strict=True)}
    for budget, s in zip(budgets, sets, strict=True):
        within = int(np.sum(nano.power_w <= budget))
        assert len(s) == min(k, within)
        assert len({tuple(m) for m in s.modes.tolist()}) == len(s)
        assert max(power[tuple(m)] for m in s.modes.tolist()) <= budget
    # the lowest budget admits fewer than k modes, the highest every mode's worth of k
    assert len(sets[0]) < k <= len(sets[-1])
