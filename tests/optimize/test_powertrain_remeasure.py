"""A near miss after the commit: a measured mode faster than the pin whose reading put it just
over the budget is measured again (up to remeasure_looks times), and its windows pooled (the
daemon's tuner and the replay both store base.pooled_measurement)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import (
    Action,
    Commit,
    Fit,
    Measure,
    Measurement,
    best_within,
    pooled_measurement,
)
from powerd.optimize.powertrain import PowerTrain
from powerd.sim.trace import Trace
from powerd_replay.training import (
    GridSpace,
    NoiseModel,
    NoisyOracle,
    RidgeFitter,
    TraceMeasurer,
    solve_budget,
)

BUDGET = 14.0


def test_two_full_windows_pool_to_step_weighted_means() -> None:
    mode = PowerMode(4, 1000, 500, 2000)
    a = Measurement(mode, 100.0, 14.3, steps=10)
    b = Measurement(mode, 130.0, 13.7, steps=30)
    m = pooled_measurement(a, b)
    assert m.steps == 40 and not m.aborted_over_budget
    assert m.time_ms == pytest.approx(122.5) and m.power_w == pytest.approx(13.85)


def test_an_abort_or_a_failed_switch_is_not_pooled() -> None:
    mode = PowerMode(4, 1000, 500, 2000)
    full = Measurement(mode, 100.0, 14.3, steps=10)
    aborted = Measurement(mode, math.nan, 16.0, steps=1, aborted_over_budget=True)
    failed = Measurement(mode, math.nan, math.inf, 0, True)
    assert pooled_measurement(None, full) is full
    assert pooled_measurement(aborted, full) is full  # an abort under a lower budget
    assert pooled_measurement(full, aborted) is aborted
    assert pooled_measurement(full, failed) is failed


def decide(strategy: PowerTrain, samples, fitter) -> Action:
    """The strategy's next action after any Fit it asks for."""
    action = strategy.next_action(BUDGET, samples)
    while isinstance(action, Fit):
        strategy.on_fitted(fitter(dict(samples)))
        action = strategy.next_action(BUDGET, samples)
    return action


@pytest.fixture
def committed(nano: Trace):
    """A powertrain run on the Orin Nano trace to its first commit at BUDGET, a mode that is
    not measured, and a step time faster than any measured (the fastest near miss is
    measured first)."""
    oracle = NoisyOracle(nano, time_err=0.10, power_err=0.05, jitter=0.02, seed=0)
    fitter = RidgeFitter(oracle, [nano.axis(f) for f in FIELDS])
    strategy = PowerTrain(GridSpace.from_trace(nano), lambda: oracle)
    samples: dict[PowerMode, Measurement] = {}
    commit, _ = solve_budget(
        strategy, BUDGET, samples, TraceMeasurer(nano, NoiseModel(seed=0)), fitter
    )
    best = best_within(samples, BUDGET)
    assert isinstance(commit, Commit) and best is not None and commit.mode == best.mode
    other = next(r.mode for r in nano.rows if r.mode not in samples)
    fast = 0.5 * min(m.time_ms for m in samples.values() if math.isfinite(m.time_ms))
    return strategy, samples, fast, other, fitter


def test_a_near_miss_is_measured_again_and_pinned_if_the_pooled_reading_fits(committed) -> None:
    strategy, samples, fast, mode, fitter = committed
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, steps=10)
    action = strategy.refine(BUDGET, samples, room=5)
    assert action == Measure(mode, pool=True, why="a second look: read 0.20 W over")
    samples[mode] = pooled_measurement(
        samples[mode], Measurement(mode, fast, BUDGET - 0.3, steps=10)
    )
    assert samples[mode].power_w == pytest.approx(BUDGET - 0.05)
    assert decide(strategy, samples, fitter) == Commit(mode)


def look_again(strategy: PowerTrain, samples, mode: PowerMode, power_w: float, fast: float):
    """Take the next look refine asks for at `mode`, reading `power_w`; pool it."""
    again = strategy.refine(BUDGET, samples, room=5)
    assert again is not None and (again.mode, again.pool) == (mode, True)
    nth = "second" if samples[mode].steps == 10 else "third"  # the log says which look
    assert again.why.startswith(f"a {nth} look: read ")
    samples[mode] = pooled_measurement(samples[mode], Measurement(mode, fast, power_w, 10))


def test_a_near_miss_still_over_after_two_windows_gets_a_third_then_no_more(committed) -> None:
    """Two windows pooled a hair over may still be noise; a third narrows it. After
    remeasure_looks more windows the mode is left as measured."""
    strategy, samples, fast, mode, fitter = committed
    assert strategy.cfg.remeasure_looks == 2
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, steps=10)
    look_again(strategy, samples, mode, BUDGET + 0.1, fast)
    assert samples[mode].power_w == pytest.approx(BUDGET + 0.15)
    assert decide(strategy, samples, fitter) != Commit(mode)  # still over
    look_again(strategy, samples, mode, BUDGET + 0.05, fast)
    assert samples[mode].steps == 30 and samples[mode].power_w == pytest.approx(BUDGET + 0.35 / 3)
    again = strategy.refine(BUDGET, samples, room=5)
    assert again is None or again.mode != mode


def test_a_third_look_pinned_when_the_three_windows_fit(committed) -> None:
    strategy, samples, fast, mode, fitter = committed
    samples[mode] = Measurement(mode, fast, BUDGET + 0.3, steps=10)
    look_again(strategy, samples, mode, BUDGET - 0.27, fast)  # pooled: 0.015 W over
    look_again(strategy, samples, mode, BUDGET - 0.1, fast)
    assert samples[mode].power_w == pytest.approx(BUDGET - 0.0233, abs=1e-3)
    assert decide(strategy, samples, fitter) == Commit(mode)


def test_the_margin_for_another_look_shrinks_with_the_windows_pooled(committed) -> None:
    """0.35 W over is a near miss for one window (remeasure_w 0.4) but not for two pooled
    (0.4 / sqrt 2 = 0.28): their noise is that much smaller."""
    strategy, samples, fast, mode, fitter = committed
    samples[mode] = Measurement(mode, fast, BUDGET + 0.35, steps=10)
    look_again(strategy, samples, mode, BUDGET + 0.35, fast)
    again = strategy.refine(BUDGET, samples, room=5)
    assert again is None or again.mode != mode


def test_one_look_only_with_remeasure_looks_at_one(committed) -> None:
    strategy, samples, fast, mode, fitter = committed
    strategy.cfg = dataclasses.replace(strategy.cfg, remeasure_looks=1)
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, steps=10)
    look_again(strategy, samples, mode, BUDGET + 0.1, fast)
    again = strategy.refine(BUDGET, samples, room=5)
    assert again is None or again.mode != mode


@pytest.mark.parametrize(
    ("power_over_w", "time_share"),
    [(0.6, 1.0), (0.2, 1000.0)],
    ids=["too far over", "no faster than the pin"],
)
def test_no_second_look_at_a_clear_miss_or_a_slower_mode(
    committed, power_over_w: float, time_share: float
) -> None:
    strategy, samples, fast, mode, fitter = committed
    samples[mode] = Measurement(mode, time_share * fast, BUDGET + power_over_w, 10)
    action = strategy.refine(BUDGET, samples, room=5)
    assert action is None or action.mode != mode


@pytest.mark.parametrize(("se_w", "again"), [(0.1, True), (0.03, False)])
def test_the_readings_standard_error_says_whether_it_is_a_near_miss(
    committed, se_w: float, again: bool
) -> None:
    """0.2 W over with a 0.1 W standard error may be noise; with 0.03 W (the daemon's
    windows of many readings) it is over, and a second window would only read it over again."""
    strategy, samples, fast, mode, _ = committed
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, 10, False, se_w)
    action = strategy.refine(BUDGET, samples, room=5)
    assert (action is not None and (action.mode, action.pool) == (mode, True)) is again


def test_pooled_windows_pool_their_standard_errors() -> None:
    mode = PowerMode(4, 1000, 500, 2000)
    a = Measurement(mode, 100.0, 14.3, 10, False, 0.1)
    b = Measurement(mode, 100.0, 13.7, 10, False, 0.1)
    assert pooled_measurement(a, b).power_se_w == pytest.approx(0.1 / math.sqrt(2))
    assert pooled_measurement(a, Measurement(mode, 100.0, 13.7, 10)).power_se_w is None


def test_no_room_no_second_look(committed) -> None:
    strategy, samples, fast, mode, fitter = committed
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, steps=10)
    assert strategy.refine(BUDGET, samples, room=0) is None


def test_remeasure_off_leaves_a_near_miss_alone(committed) -> None:
    strategy, samples, fast, mode, fitter = committed
    strategy.cfg = dataclasses.replace(strategy.cfg, remeasure_w=0.0)
    samples[mode] = Measurement(mode, fast, BUDGET + 0.2, steps=10)
    action = strategy.refine(BUDGET, samples, room=5)
    assert action is None or action.mode != mode
