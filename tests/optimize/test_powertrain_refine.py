"""powertrain after the commit (Strategy.refine), replayed with the stand-in predictors: it
measures only modes the model puts within the budget, keeps to each budget's room, and the
pin it ends on is the fastest measured mode that fits."""

from __future__ import annotations

import pytest
from refine_watch import sweep

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, fits
from powerd.sim.trace import Trace
from powerd_replay.training import inconsistent_rows


@pytest.fixture(scope="module")
def refined(mobilenet: Trace):
    return sweep(mobilenet, [24.0, 18.0, 35.0, 28.0], refine_room=60)


def test_it_measures_after_the_commit_within_each_budgets_room(refined) -> None:
    watch, res = refined
    assert watch.refines, "nothing was measured after a commit"
    assert sum(r.refined for r in res.rows) == len(watch.refines) + len(watch.again)
    per_budget = [len(watch.new.get(r.budget_w, ())) for r in res.rows]
    # the first budget: at most max_modes; each change: change_modes (+1: the min mode)
    assert per_budget[0] <= 50 and max(per_budget[1:]) <= 5, per_budget
    assert res.false_commits == 0


def test_it_measures_only_modes_predicted_within_the_budget(refined) -> None:
    watch, _ = refined
    for pick in watch.refines:
        budget, _, predicted_w = pick
        # a long shot (predicted over, under a wide power interval) and a swap neighbour
        # of the pin (measured whatever power the model reads) are the exceptions
        assert predicted_w <= budget or pick in watch.longshots or pick in watch.swaps
    # a mode measured again read over the budget by less than remeasure_w (a near miss)
    margin = watch.inner.cfg.remeasure_w
    for budget, m in watch.again:
        assert budget < m.power_w <= budget + margin and not m.aborted_over_budget


def test_a_faster_measured_mode_replaces_the_pin(refined) -> None:
    watch, res = refined
    for row in res.rows:
        times = [t for b, _, t in watch.commits if b == row.budget_w]
        # each commit is the fastest measured mode that fits: never slower than the last
        assert all(b <= a for a, b in zip(times, times[1:], strict=False)), times
    assert any(r.mode != r.first_mode for r in res.rows), "no refinement ever paid off"


def test_no_room_no_refinement(mobilenet: Trace) -> None:
    watch, res = sweep(mobilenet, [24.0, 18.0], refine_room=0)
    assert not watch.refines and all(r.refined == 0 for r in res.rows)
    assert all(r.mode == r.first_mode for r in res.rows)
    samples = {}
    strategy = watch.inner
    assert strategy.refine(24.0, samples, room=5) is None  # nothing measured: nothing to beat


def test_refinement_never_pins_a_mode_whose_measurement_is_over(mobilenet: Trace) -> None:
    watch, res = sweep(mobilenet, [16.0, 30.0, 21.0], refine_room=60, seed=2)
    for row in res.rows:
        assert row.feasible
    for b, mode, _ in watch.commits:
        assert fits(Measurement(mode, 1.0, mobilenet.lookup(mode).power_w), b + 1.0)


def test_inconsistent_rows_flags_a_row_drawing_less_than_a_mode_it_dominates(
    mobilenet: Trace,
) -> None:
    bad = inconsistent_rows(mobilenet)
    glitch = PowerMode(10, 422400, 624750000, 3199000000)  # 14.35 W; its neighbours 18-22 W
    i = next(k for k, r in enumerate(mobilenet.rows) if r.mode == glitch)
    assert bad[i]
    assert 0 < bad.sum() < 0.1 * len(bad)
    # the lowest mode dominates nothing: never flagged
    lo = min(range(len(mobilenet.rows)), key=lambda k: mobilenet.rows[k].mode.as_tuple())
    assert not bad[lo]
