"""The first budget rehearses lower budgets after its own refine picks (PowerTrain._rehearse):
while its room lasts, the job measures the modes refine would pick under budgets 1 W apart
below its own, so a later set_budget to the bottom of the range finds the model fitted there.
Replayed on MobileNet v3 training with the stand-in predictors."""

from __future__ import annotations

import numpy as np
import pytest
from refine_watch import sweep

from powerd.sim.trace import Trace

HIGH, LOW = 35.0, 16.0


@pytest.fixture(scope="module")
def rehearsed(mobilenet: Trace):
    return sweep(mobilenet, [HIGH, LOW], refine_room=60)


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


def test_each_rehearsal_says_which_lower_budget_it_is_for(rehearsed) -> None:
    """The tuner logs it: a mode slower than the pinned one, measured while the job trains,
    is not a search gone wrong."""
    watch, _ = rehearsed
    rehearsed_modes = {m for _, m, _ in watch.rehearsed}
    notes = dict(watch.why)
    for mode in rehearsed_modes:
        words = notes[mode].split()
        assert words[:2] == ["rehearsing", "a"] and words[3:] == ["W", "budget"], notes[mode]
        assert float(words[2]) <= HIGH - 1.0
    others = [why for m, why in watch.why if m not in rehearsed_modes]
    assert all(
        why in ("", "a long shot: predicted over the budget") or why.startswith("a second look")
        for why in others
    ), others


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
    watch, _ = sweep(mobilenet, [HIGH], refine_room=60, rehearse_modes=cap)
    assert len(watch.rehearsed) == cap


def test_rehearsals_keep_to_the_first_budgets_room(mobilenet: Trace) -> None:
    watch, _ = sweep(mobilenet, [HIGH], refine_room=60, max_modes=20)
    assert len(watch.new[HIGH]) <= 20


def test_a_first_budget_at_the_bottom_of_the_range_has_nothing_to_rehearse(
    mobilenet: Trace,
) -> None:
    low = min(r.power_w for r in mobilenet.rows) + 0.5
    watch, _ = sweep(mobilenet, [low], refine_room=60)
    assert not watch.rehearsed


def test_no_finite_power_prediction_no_rehearsal(mobilenet: Trace) -> None:
    """A model that predicts no finite power anywhere rehearses nothing (and does not fail)."""
    watch, _ = sweep(mobilenet, [HIGH], refine_room=60, rehearse_modes=50)
    strategy = watch.inner
    nan = np.full(len(strategy.mode_list), np.nan)
    assert strategy._rehearse(HIGH, {}, (nan, nan, nan, nan)) is None
