"""tools/bench_prediction.py's `under` design: per budget, only modes the budget admits."""

from __future__ import annotations

import bench_prediction
import numpy as np
import pytest

from powerd.predictor.transfer import RidgeOptions, fit_ridge
from powerd.sim.trace import Trace
from powerd_replay.training import own_range_budgets


def test_under_sets_hold_only_modes_within_their_budget(nano: Trace, reference) -> None:
    k = 12
    sets = bench_prediction.sample_sets(nano, reference, RidgeOptions(), "under", k, seed=0)
    # every own-range budget admits at least two modes: one set each, named by its budget
    assert [b for b, _ in sets] == list(own_range_budgets(nano))
    power = {tuple(m): p for m, p in zip(nano.modes_array.tolist(), nano.power_w, strict=True)}
    for budget, s in sets:
        within = int(np.sum(nano.power_w <= budget))
        assert len(s) == min(k, within)
        assert len({tuple(m) for m in s.modes.tolist()}) == len(s)
        assert max(power[tuple(m)] for m in s.modes.tolist()) <= budget
    # the lowest budget admits fewer than k modes, the highest at least k
    assert len(sets[0][1]) < k <= len(sets[-1][1])


def test_power_error_splits_at_the_budget(nano: Trace, reference) -> None:
    budget, s = bench_prediction.sample_sets(nano, reference, RidgeOptions(), "under", 20, 0)[3]
    fp = fit_ridge(s, reference)
    # the benchmark judges what `powerctl predict` shows: the overall power head
    assert fp.has_overall
    err = np.abs(fp.predict_overall(nano.modes_array)[1] - nano.power_w) / nano.power_w * 100
    over = nano.power_w > budget
    row = bench_prediction.judge(fp, nano, budget)
    assert row["p_within"] == pytest.approx(float(np.mean(err[~over])))
    assert row["p_over"] == pytest.approx(float(np.mean(err[over])))
    # the two sides weighted by their modes are the MAPE over every mode
    whole = (row["p_within"] * (~over).sum() + row["p_over"] * over.sum()) / len(err)
    assert whole == pytest.approx(row["p_mape"])
    no_budget = bench_prediction.judge(fp, nano)
    assert np.isnan(no_budget["p_within"]) and np.isnan(no_budget["p_over"])


def test_mixed_sets_are_one_workload_whose_samples_grow(nano: Trace, reference) -> None:
    from itertools import islice

    from powerd_replay.training import mixed_order

    sets = list(
        islice(bench_prediction.mixed_sets(nano, reference, RidgeOptions(), 0, (0.006, 0.05)), 3)
    )
    # the budgets in the seed's shuffled order, each set what had been measured after it:
    # the earlier sets' modes, plus what the budget change (and its refine) added
    assert [b for b, _ in sets] == mixed_order(own_range_budgets(nano), 0)[:3]
    sizes = [len(s) for _, s in sets]
    assert sizes[0] >= 10 and sizes[0] < sizes[1] < sizes[2]
    for (_, before), (_, after) in zip(sets, sets[1:], strict=False):
        assert set(before) < set(after)
