"""Budget changes upwards from a low first budget, replayed over many noise draws with the
daemon's own model (bundled reference, ridge refit): the hard case for a change's four
modes, since every sample the model has sits at the bottom of the power range. A first
budget that low stops after 7-10 modes, fewer than a first budget's seeds, so the budgets
after it share the first's room until the workload has its seeds.

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
FIRST_ROOM, SEEDS_OF_A_FIRST_BUDGET, CHANGE_ROOM = 50, 15, 4  # powertrain's defaults


def nano_replays(nano: Trace, budgets: list[float], seeds: range):
    ref = ReferenceModel.load()
    space = GridSpace.from_trace(nano)

    def fitter(samples):
        return fit_workload(samples, ref, method="ridge")

    return [
        replay_sweep(
            lambda: make_strategy("powertrain", space, predictor_factory=lambda: ref),
            nano,
            budgets,
            fitter=fitter,
            noise=NoiseModel(seed=seed),
        )
        for seed in seeds
    ]


@pytest.fixture(scope="module")
def nano_sweeps(nano: Trace):
    return nano_replays(nano, BUDGETS, SEEDS)


def test_no_change_pins_a_mode_over_its_budget(nano_sweeps) -> None:
    for sweep in nano_sweeps:
        before = 0  # modes the workload had when the budget came
        for row in sweep.rows:
            assert row.power_w <= row.budget_w + 0.5, row
            if before < SEEDS_OF_A_FIRST_BUDGET:  # still the first budget's room
                assert before + row.new_probes <= FIRST_ROOM, row
            else:
                assert row.new_probes <= CHANGE_ROOM, row
            before += row.new_probes
        # the first budget stops short of its seeds here: at least one budget shared it
        assert sweep.rows[0].new_probes < SEEDS_OF_A_FIRST_BUDGET


def test_changes_rarely_land_far_from_the_best_mode(nano_sweeps) -> None:
    # Measured: 1 of these 40 draws put a budget over 1.6x the best mode's step time (16 W,
    # 1.87x); mean penalty 6.5 %. When a change got four modes after the 7-10 of the 9 W
    # budget: 4 of 40, worst 2.07x, mean 12.1 % (session 14's code: 2 of 40; 5 of 40 before
    # aborted windows bounded the power fit; docs/experiments.md, "Session 7", "Session 15"
    # and "Session 24").
    far = [s for s in nano_sweeps if any(r.penalty > 0.6 for r in s.rows)]
    assert len(far) <= 2, [[(r.budget_w, round(r.penalty, 2)) for r in s.rows] for s in far]
    worst = max(r.penalty for s in nano_sweeps for r in s.rows)
    assert worst < 1.0, worst
    mean = sum(r.penalty for s in nano_sweeps for r in s.rows) / (4 * len(nano_sweeps))
    assert mean < 0.09, mean


def test_a_change_right_after_a_low_first_budget_finds_the_new_budgets_modes(
    nano: Trace,
) -> None:
    """9 W, then 15 W (a user-testing case: set_budget raised after a low start). The 9 W
    budget stops after 7-10 modes, all near 9 W. Fails on the old strategy: the 15 W
    change's four modes mostly went over the budget, and it pinned an old 9-11 W mode at
    up to 2.96x the best step time: 8 of these 20 draws over 1.6x, mean penalty against
    the best regular row 39.9 % (now 1 of 20, 6.0 %, with 10-22 modes for 15 W)."""
    sweeps = nano_replays(nano, [9.0, 15.0], range(20))
    at15 = [s.rows[1] for s in sweeps]
    far = [r for r in at15 if r.penalty > 0.6]
    assert len(far) <= 2, [(round(r.penalty, 2), r.mode) for r in far]
    assert sum(r.penalty_consistent for r in at15) / len(at15) < 0.12
    for r in at15:
        assert r.power_w <= 15.5, r


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
