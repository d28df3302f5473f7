"""How a search ends when no measured mode fits (powerd.optimize.base.conclude): a lowest
mode whose window was cut short, or that read more than a higher mode, gets one more window
for that budget before the budget is called infeasible, and both strategies use it."""

from __future__ import annotations

import math

import pytest

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import Commit, Measure, Measurement, conclude, floor_in_doubt
from powerd.optimize.binary_search import BinarySearch
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

LOW = PowerMode(1, 100, 100, 100)
MID = PowerMode(2, 200, 200, 200)
HIGH = PowerMode(4, 400, 400, 400)


def floor_again(action: object) -> bool:
    """A second, whole window at the lowest mode, saying why (for the daemon's log)."""
    return (
        isinstance(action, Measure)
        and action.mode == LOW
        and action.full_window
        and "infeasible" in action.why
    )


def aborted(mode: PowerMode, watts: float) -> Measurement:
    return Measurement(mode, math.nan, watts, steps=1, aborted_over_budget=True)


def test_a_floor_read_over_a_higher_mode_is_measured_once_more_per_budget() -> None:
    samples = {LOW: aborted(LOW, 17.0), MID: aborted(MID, 11.0)}
    assert floor_in_doubt(samples, LOW)
    rechecked: set[float] = set()
    action = conclude(samples, 10.0, LOW, rechecked)
    assert floor_again(action) and "17.00 W" in action.why
    assert rechecked == {10.0}
    # the same reading again: the budget is infeasible, held at the least power measured
    assert conclude(samples, 10.0, LOW, rechecked) == Commit(MID, feasible=False)
    # a second window that fits is held
    samples[LOW] = Measurement(LOW, 80.0, 9.2, steps=10)
    assert conclude(samples, 10.0, LOW, rechecked) == Commit(LOW)


def full(mode: PowerMode, watts: float) -> Measurement:
    return Measurement(mode, 90.0, watts, steps=10)


def test_a_floor_timed_in_full_that_reads_least_is_not_measured_again() -> None:
    samples = {LOW: full(LOW, 10.6), MID: aborted(MID, 12.0), HIGH: aborted(HIGH, 15.0)}
    assert not floor_in_doubt(samples, LOW)
    rechecked: set[float] = set()
    assert conclude(samples, 10.0, LOW, rechecked) == Commit(LOW, feasible=False)
    assert not rechecked
    # over a higher mode's reading, but within the noise margin: not in doubt either
    samples[MID] = full(MID, 10.3)
    assert not floor_in_doubt(samples, LOW)
    samples[MID] = full(MID, 10.0)
    assert floor_in_doubt(samples, LOW)


def test_a_floor_cut_short_is_in_doubt_alone() -> None:
    samples = {LOW: aborted(LOW, 17.0)}
    assert floor_in_doubt(samples, LOW)
    rechecked: set[float] = set()
    assert floor_again(conclude(samples, 10.0, LOW, rechecked))
    assert conclude(samples, 10.0, LOW, rechecked) == Commit(LOW, feasible=False)
    # another budget gets its own second look
    assert floor_again(conclude(samples, 9.0, LOW, rechecked))


def test_a_failed_switch_is_never_in_doubt() -> None:
    assert not floor_in_doubt({LOW: Measurement(LOW, math.nan, math.inf, 0, True)}, LOW)
    # a higher mode whose switch failed (power inf) says nothing about the floor
    samples = {LOW: full(LOW, 17.0), MID: Measurement(MID, math.nan, math.inf, 0, True)}
    assert not floor_in_doubt(samples, LOW)
    # without the strategy's record, conclude keeps its one-window answer
    samples = {LOW: aborted(LOW, 17.0), MID: aborted(MID, 11.0)}
    assert conclude(samples, 10.0, LOW) == Commit(MID, feasible=False)


class FloorReadStale(TraceMeasurer):
    """The first window at the lowest mode reads the power of the mode before the switch
    (a sensor that had not caught up), then the trace as usual."""

    def __init__(self, trace: Trace, stale_w: float):
        super().__init__(trace, NoiseModel(power_w=0.02, seed=0))
        self.lowest = GridSpace.from_trace(trace).min_mode()
        self.stale_w = stale_w
        self.stale_reads = 0

    def measure(self, mode: PowerMode, budget_w: float) -> Measurement:
        if mode == self.lowest and self.stale_reads == 0:
            self.stale_reads += 1
            return aborted(mode, self.stale_w)
        return super().measure(mode, budget_w)


def strategy(trace: Trace, name: str):
    """(strategy, fitter) of the replay: powertrain with the replay's stand-in predictor."""
    space = GridSpace.from_trace(trace)
    if name == "binary-search":
        return BinarySearch(space), None
    oracle = NoisyOracle(trace, time_err=0.10, power_err=0.05, jitter=0.02, seed=0)
    fitter = RidgeFitter(oracle, [trace.axis(f) for f in FIELDS])
    return PowerTrain(space, lambda: oracle, max_modes=50), fitter


@pytest.mark.parametrize("name", ["binary-search", "powertrain"])
def test_one_stale_floor_reading_does_not_make_a_budget_infeasible(nano: Trace, name) -> None:
    powers = sorted(float(w) for w in nano.power_w)
    budget = round((powers[0] + powers[1]) / 2, 2)  # only the lowest mode meets it
    chosen, fitter = strategy(nano, name)
    measurer = FloorReadStale(nano, stale_w=float(nano.power_w.max()))
    samples: dict[PowerMode, Measurement] = {}
    commit, _ = solve_budget(chosen, budget, samples, measurer, fitter)
    assert measurer.stale_reads == 1
    assert commit.feasible, commit
    m = samples[commit.mode]
    assert not m.aborted_over_budget and m.power_w <= budget
    assert commit.mode == measurer.lowest
