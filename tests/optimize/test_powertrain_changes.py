"""Budget changes upwards from a low first budget, replayed over many noise draws with the
daemon's own model (bundled reference, ridge refit): the hard case for a change's four
modes, since every sample the model has sits at the bottom of the power range.

A single run through the daemon (tests/test_e2e_budgets.py) is one noise draw; here the
same sweep is replayed deterministically over 40 draws, so a change in how often a
change's picks go wrong shows up as a count."""

from __future__ import annotations

import pytest

from powerd.optimize import make_strategy
from powerd.predictor import ReferenceModel, fit_workload
from powerd.sim.trace import Trace
from powerd_replay.training import GridSpace, NoiseModel, replay_sweep

SEEDS = range(40)
BUDGETS = [9.0, 12.0, 16.0, 20.0]  # Orin Nano, as tests/test_e2e_budgets.py sweeps it


@pytest.fixture(scope="module")
def nano_sweeps(nano: Trace):
    ref = ReferenceModel.load()
    space = GridSpace.from_trace(nano)

    def fitter(samples):
        return fit_workload(samples, ref, method="ridge")

    return [
        replay_sweep(
            lambda: make_strategy("powertrain", space, predictor_factory=lambda: ref),
            nano,
            BUDGETS,
            fitter=fitter,
            noise=NoiseModel(seed=seed),
        )
        for seed in SEEDS
    ]


def test_no_change_pins_a_mode_over_its_budget(nano_sweeps) -> None:
    for sweep in nano_sweeps:
        for row in sweep.rows:
            assert row.power_w <= row.budget_w + 0.5, row
            assert row.new_probes <= (50 if row.budget_w == BUDGETS[0] else 4), row


def test_changes_rarely_land_far_from_the_best_mode(nano_sweeps) -> None:
    # Measured: 4 of these 40 draws put a budget over 1.6x the best mode's step time, all
    # at 16 W, worst 2.09x; 15 of draws 0-159 (session 14's code: 2 of 40, 11 of 160,
    # worst 2.09x in draws 40-159; 5 of 40 before aborted windows bounded the power fit).
    # The four modes of a change cannot always undo a model fitted on 9 W samples
    # (docs/experiments.md, "Session 7" and "Session 15": session 15's exploring and
    # core-count guard cost a little here and gained in the mixed-order replays).
    far = [s for s in nano_sweeps if any(r.penalty > 0.6 for r in s.rows)]
    assert len(far) <= 5, [[(r.budget_w, round(r.penalty, 2)) for r in s.rows] for s in far]
    worst = max(r.penalty for s in nano_sweeps for r in s.rows)
    assert worst < 1.2, worst
    mean = sum(r.penalty for s in nano_sweeps for r in s.rows) / (4 * len(nano_sweeps))
    assert mean < 0.15, mean


def test_a_first_budget_no_mode_meets_leaves_the_next_budget_a_first_budgets_room(
    nano: Trace,
) -> None:
    """An impossible first budget (5 W on a board whose least mode draws ~8 W) commits
    nothing after one or two measurements. Fails on the old strategy: the next budget got
    a change's four modes, and 16 W pinned a mode at 2.3x the best step time (a fresh
    16 W job: 1.09-1.25x)."""
    ref = ReferenceModel.load()
    space = GridSpace.from_trace(nano)

    def fitter(samples):
        return fit_workload(samples, ref, method="ridge")

    def make():
        return make_strategy("powertrain", space, predictor_factory=lambda: ref)

    for seed in range(3):
        after = replay_sweep(make, nano, [5.0, 16.0], fitter=fitter, noise=NoiseModel(seed=seed))
        fresh = replay_sweep(make, nano, [16.0], fitter=fitter, noise=NoiseModel(seed=seed))
        first, then = after.rows
        assert first.power_w > 5.0 and first.new_probes <= 2  # nothing meets 5 W
        assert 4 < then.new_probes <= 50 - first.new_probes, then
        assert then.penalty <= max(fresh.rows[0].penalty, 0.0) + 0.05, (then, fresh.rows[0])
