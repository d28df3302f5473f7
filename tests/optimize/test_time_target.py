"""The step-time objective, replayed: both strategies behind StepTimeSearch pin a measured
mode that meets the target at close to the lowest power that can; infeasible targets are
committed as such with the fastest achievable time."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.modes import FIELDS
from powerd.optimize import make_strategy
from powerd.optimize.time_target import StepTimeSearch
from powerd.sim.trace import Trace
from powerd_replay.training import (
    GridSpace,
    NoiseModel,
    NoisyOracle,
    RidgeFitter,
    TraceMeasurer,
    own_range_budgets,
    replay_time_targets,
    solve_budget,
    time_targets,
)


def factory(name: str, trace: Trace):
    oracle = NoisyOracle(trace, time_err=0.10, power_err=0.05, jitter=0.02, seed=0)
    fitter = RidgeFitter(oracle, [trace.axis(f) for f in FIELDS])
    space = GridSpace.from_trace(trace)
    return (lambda: make_strategy(name, space, predictor_factory=lambda: oracle)), fitter


@pytest.mark.parametrize("name", ["powertrain", "binary-search"])
def test_pinned_mode_meets_the_target_at_low_power(nano: Trace, name: str) -> None:
    make, fitter = factory(name, nano)
    targets = time_targets(nano, own_range_budgets(nano))
    assert len(targets) >= 5
    res = replay_time_targets(
        make, nano, targets, cap_w=40.0, fitter=fitter, noise=NoiseModel(seed=0)
    )
    assert all(r.feasible for r in res)
    assert sum(r.met for r in res) >= len(res) - 1
    # never the lazy answer (the fastest mode): the median power stays near the optimum
    assert float(np.median([r.power_excess for r in res])) <= 0.2
    fastest = nano.rows[int(np.argmin(nano.time_ms))]
    assert sum(r.power_w >= fastest.power_w for r in res) <= 1


def test_an_infeasible_target_commits_the_fastest_with_feasible_false(nano: Trace) -> None:
    make, fitter = factory("powertrain", nano)
    search = StepTimeSearch(make(), step_time_ms=0.5 * float(nano.time_ms.min()))
    samples: dict = {}
    commit, _ = solve_budget(search, 40.0, samples, TraceMeasurer(nano, NoiseModel()), fitter)
    assert not commit.feasible
    assert search.fastest_ms is not None
    # the fastest achievable: within a few % of the trace's fastest mode
    assert search.fastest_ms <= 1.1 * float(nano.time_ms.min())
    assert samples[commit.mode].time_ms == search.fastest_ms


def test_the_power_cap_is_respected(nano: Trace) -> None:
    make, fitter = factory("powertrain", nano)
    cap = 12.0
    search = StepTimeSearch(make(), step_time_ms=float(nano.time_ms.max()))  # trivially met
    samples: dict = {}
    commit, _ = solve_budget(search, cap, samples, TraceMeasurer(nano, NoiseModel()), fitter)
    assert commit.feasible and samples[commit.mode].power_w <= cap
