"""A pair read just over the budget is measured again and its readings pooled (planner level,
a synthetic model, no daemon): one window's power noise must not turn away the only pair
that fits, and a pair clearly over the budget is never measured twice."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerd.modes import PowerMode
from powerd.optimize.inference import (
    BORDER_Z,
    MAX_WINDOWS,
    RATE_NEW_PAIRS,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    few_readings_power,
    pooled,
    readings_mean,
    worth_remeasuring,
)

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
SIZES = (1, 4)


class Model:
    """Batch time (5 + 2b)/g ms, power 5 + 3g W."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(float)
        b = np.asarray(b, float)
        return (5 + 2 * b) / g, 5 + 3 * g + 0 * b


def pair(g: int, b: int) -> Pair:
    return Pair(PowerMode(4, 1000, g, 1000), b)


def reading(q: Pair, power_w: float, sd: float = 0.15, n: int = 36, windows: int = 1):
    t, _ = Model().predict(np.array([q.mode.as_tuple()]), np.array([q.batch_size]))
    return PairMeasurement(q, float(t[0]), power_w, float(t[0]), 40, sd, n, windows)


def test_pooled_power_is_the_mean_over_all_readings_and_its_spread_includes_both_windows():
    a = reading(pair(2, 1), 15.05, sd=0.1, n=30)
    b = reading(pair(2, 1), 14.95, sd=0.1, n=10)
    m = pooled(a, b)
    assert m.power_w == pytest.approx((30 * 15.05 + 10 * 14.95) / 40)
    assert m.power_n == 40 and m.windows == 2 and m.batches == 80
    # the windows' 0.1 W difference adds to the within-window spread
    assert 0.1 < m.power_sd_w < 0.11
    assert m.power_se_w == pytest.approx(m.power_sd_w / math.sqrt(40))
    assert pooled(None, a) is a
    # a window that measured nothing keeps the other's reading
    empty = PairMeasurement(pair(2, 1), math.nan, math.nan)
    assert pooled(a, empty).power_w == a.power_w and pooled(a, empty).windows == 2


def window_of(readings: list[float]) -> PairMeasurement:
    """A window's reading of pair(2, 1) from its in-batch power readings, as a window
    reports it: few readings read their mean plus its standard error."""
    r = np.array(readings)
    sd = float(np.std(r, ddof=1)) if len(r) > 1 else None
    return reading(pair(2, 1), few_readings_power(float(r.mean()), sd, len(r)), sd, len(r))


@pytest.mark.parametrize(
    "first, second",
    [
        ([20.1, 20.6, 20.4, 20.7], [20.5, 19.9, 20.6, 20.3]),  # 8 together: their mean
        ([20.1, 20.6], [20.5, 19.9, 20.6]),  # 5 together: still few
        ([20.0], [20.4]),  # single readings: no spread of their own
        ([20.2] * 3, [20.2] * 3),  # no spread at all: the sensor's floor
    ],
)
def test_pooled_windows_of_few_readings_read_what_their_readings_read_together(first, second):
    # Each window's margin for its few readings comes off before pooling: two windows of 4
    # readings are 8 readings, whose plain mean is the pair's power (kept, the margins of
    # both windows would have read it high).
    both = np.array(first + second)
    m = pooled(window_of(first), window_of(second))
    assert m.power_n == len(both)
    assert m.power_sd_w == pytest.approx(float(np.std(both, ddof=1)), abs=1e-9)
    expected = few_readings_power(float(both.mean()), float(np.std(both, ddof=1)), len(both))
    assert m.power_w == pytest.approx(expected, abs=1e-9)
    assert (m.power_w > both.mean()) == (len(both) < 8)
    for w in (first, second):
        assert readings_mean(window_of(w)) == pytest.approx(float(np.mean(w)), abs=1e-9)


def test_only_a_reading_within_noise_of_the_budget_is_worth_another_window():
    goal = InferenceGoal(rate_hz=100, budget_w=15.0, latency_ms=100)
    se = 0.15 / 6  # 36 readings of 0.15 W spread
    assert worth_remeasuring(reading(pair(2, 1), 15.0 + 0.5 * se), goal)
    assert worth_remeasuring(reading(pair(2, 1), 15.0 + BORDER_Z * se * 0.99), goal)
    assert not worth_remeasuring(reading(pair(2, 1), 15.0 + BORDER_Z * se * 1.01), goal)
    assert not worth_remeasuring(reading(pair(2, 1), 14.99), goal)  # it fits already
    assert not worth_remeasuring(reading(pair(2, 1), 15.01, windows=MAX_WINDOWS), goal)
    assert not worth_remeasuring(reading(pair(2, 1), 15.01, sd=0.15, n=1), goal)  # no spread
    # one that would miss the latency target anyway is not
    tight = InferenceGoal(rate_hz=100, budget_w=15.0, latency_ms=3.0)
    assert not worth_remeasuring(reading(pair(2, 1), 15.01), tight)


def test_the_only_pair_that_fits_read_just_over_the_budget_is_measured_again_then_served():
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model(), max_pairs=3)
    goal = InferenceGoal(rate_hz=100, budget_w=11.0, latency_ms=100)
    # g=2 draws 11 W by the model; its window read 11.02 W; g=3 is clearly over
    samples = {
        pair(2, 1): reading(pair(2, 1), 11.02),
        pair(3, 1): reading(pair(3, 1), 14.0),
        pair(3, 4): reading(pair(3, 4), 14.0),
        pair(1, 16): reading(pair(1, 16), 9.6),  # within the budget, 187 ms: too slow
    }
    # By default a rate change profiles nothing, not even a second window: it serves the
    # best latency measured within the budget, flagged infeasible.
    session = InferenceSession(pl, goal, profiled=True)
    session.set_rate(100.0)
    held = session.next_action(samples)
    assert isinstance(held, ServePair) and not held.feasible and held.pair == pair(1, 16)
    # An admin's rate_change_pairs lets it measure: the pair read just over gets a second
    # window, which is no new pair.
    session = InferenceSession(pl, goal, profiled=True, rate_search_pairs=8)
    session.set_rate(100.0)
    assert session._limit == RATE_NEW_PAIRS
    action = session.next_action(samples)
    assert action == MeasurePair(pair(2, 1))
    session.measured(pair(2, 1))
    samples[pair(2, 1)] = pooled(samples[pair(2, 1)], reading(pair(2, 1), 10.97))
    served = session.next_action(samples)
    assert isinstance(served, ServePair) and served.feasible and served.pair == pair(2, 1)
    assert served.power_w == pytest.approx(10.995)


def test_a_pair_still_over_after_max_windows_is_not_measured_again():
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model(), max_pairs=2)
    goal = InferenceGoal(rate_hz=100, budget_w=11.0, latency_ms=100)
    samples = {
        pair(2, 1): reading(pair(2, 1), 11.02, windows=MAX_WINDOWS),
        pair(3, 1): reading(pair(3, 1), 14.0),
    }
    action = pl.next_action(goal, samples)
    assert not (isinstance(action, MeasurePair) and action.pair == pair(2, 1))


def test_with_a_latency_target_a_pair_that_fits_is_never_traded_for_one_at_the_budget():
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model(), max_pairs=3)
    goal = InferenceGoal(rate_hz=100, budget_w=11.0, latency_ms=100)
    samples = {
        pair(1, 1): reading(pair(1, 1), 8.0),  # fits, less power
        pair(2, 1): reading(pair(2, 1), 11.02),
        pair(3, 1): reading(pair(3, 1), 14.0),
    }
    action = pl.next_action(goal, samples)
    assert isinstance(action, ServePair) and action.pair == pair(1, 1)


def test_without_a_latency_target_a_faster_pair_at_the_budget_is_measured_again():
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model(), max_pairs=3)
    goal = InferenceGoal(rate_hz=100, budget_w=11.0)  # least latency under 11 W
    samples = {
        pair(1, 1): reading(pair(1, 1), 8.0),  # fits: 7 ms
        pair(2, 1): reading(pair(2, 1), 11.02),  # 3.5 ms, read just over
        pair(3, 1): reading(pair(3, 1), 14.0),
    }
    assert pl.next_action(goal, samples) == MeasurePair(pair(2, 1))
    samples[pair(2, 1)] = pooled(samples[pair(2, 1)], reading(pair(2, 1), 11.08))
    # pooled 11.05 W from 72 readings: now beyond noise of the budget; serve the pair that fits
    action = pl.next_action(goal, samples)
    assert isinstance(action, ServePair) and action.pair == pair(1, 1)


def test_a_reading_replaced_with_the_same_window_count_is_fitted_again():
    """The planner's predictions are cached by the readings: a pair read again (a probe cut
    short over the budget replaces a one-window reading) must reach the fit, not the cache."""
    fits: list[dict] = []

    def fitter(samples):
        fits.append(dict(samples))
        return Model()

    planner = InferencePlanner(MODES, SIZES, fitter)
    q = pair(2, 1)
    planner.predictions({q: reading(q, 11.0)})
    planner.predictions({q: reading(q, 11.0)})  # the same reading, a new dict: cached
    assert len(fits) == 1
    planner.predictions({q: reading(q, 13.5)})  # one window again, another power
    assert len(fits) == 2 and fits[-1][q].power_w == 13.5
