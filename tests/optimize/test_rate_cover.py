"""The rate axis's arithmetic (powerd.optimize.rate_cover): the ladder, which rates measured
pairs fit, and which unmeasured pair is expected to cover the most of the rest."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.optimize import rate_cover
from powerd.optimize.inference import DRAIN_FRACTION

SURE = 1e-6  # a spread so small that the model is taken at its word


def test_the_ladder_runs_down_from_the_top_in_ten_percent_steps() -> None:
    rates = rate_cover.rate_ladder(200.0)
    assert rates[0] == 200.0
    assert np.allclose(rates[:-1] / rates[1:], rate_cover.RATE_STEP)
    assert rates[-1] >= 200.0 / rate_cover.RATE_SPAN > rates[-1] / rate_cover.RATE_STEP
    assert rate_cover.rate_ladder(float("nan")).size == 0
    assert rate_cover.rate_ladder(0.0).size == 0


def test_a_measured_pair_covers_the_rates_between_its_fill_and_drain_limits() -> None:
    # b=4, 20 ms median, 25 ms tail, 10 W; latency target 100 ms
    rates = np.array([20.0, 40.0, 100.0, 170.0, 190.0])
    got = rate_cover.covered(
        np.array([4.0]), np.array([20.0]), np.array([25.0]), np.array([10.0]),
        rates, 12.0, 100.0, DRAIN_FRACTION,
    )  # fmt: skip
    # 20/s: the batch fills in 150 ms (> 100 - 25); drain limit 0.9 * 4 / r >= 20 ms: r <= 180
    assert got.tolist() == [False, True, True, True, False]
    over = rate_cover.covered(
        np.array([4.0]), np.array([20.0]), np.array([25.0]), np.array([13.0]),
        rates, 12.0, 100.0, DRAIN_FRACTION,
    )  # fmt: skip
    assert not over.any()  # over the budget: fits no rate
    no_target = rate_cover.covered(
        np.array([4.0]), np.array([20.0]), np.array([25.0]), np.array([10.0]),
        rates, 12.0, None, DRAIN_FRACTION,
    )  # fmt: skip
    assert no_target.tolist() == [True, True, True, True, False]


def _cover(t, p, b, rates, candidate=None, t_spread=SURE, latency_ms=100.0):
    t, p, b = (np.asarray(x, float) for x in (t, p, b))
    cand = np.ones(len(t), dtype=bool) if candidate is None else np.asarray(candidate)
    return rate_cover.best_cover(
        b, t, np.full(len(t), t_spread), p, np.full(len(t), SURE), cand,
        np.asarray(rates, float), 15.0, latency_ms, DRAIN_FRACTION, 0.0,
    )  # fmt: skip


def test_the_pair_covering_the_most_uncovered_rates_is_picked() -> None:
    rates = rate_cover.rate_ladder(400.0)
    # three pairs within 15 W: b=1 at 10 ms (rates <= 90/s), b=16 at 40 ms (fills in
    # 15/r <= 60 ms: r >= 250/s; drains r <= 360/s), b=16 at 30 ms (r >= 214, <= 480/s);
    # a fourth, fastest, over the budget
    t, p, b = [10.0, 40.0, 30.0, 5.0], [10.0, 12.0, 14.0, 20.0], [1, 16, 16, 1]
    i, gain = _cover(t, p, b, rates)
    assert i == 0  # b=1 covers the most ladder rates
    assert gain == pytest.approx(np.sum(rates <= 90.0 + 1e-9))
    # with the low rates covered, the fast b=16 pair adds the most of the rest
    i, _ = _cover(t, p, b, rates[rates > 90.0])
    assert i == 2
    # measured or not a candidate: never picked
    i, _ = _cover(t, p, b, rates[rates > 90.0], candidate=[True, True, False, True])
    assert i == 1


def test_nothing_is_picked_when_no_pair_is_expected_to_cover_enough() -> None:
    # the only pair predicted able to fit 300/s is 3x too slow for it, with a 10 % spread
    i, gain = _cover([150.0], [10.0], [16], [300.0], t_spread=0.1)
    assert i is None and gain < rate_cover.MIN_COVER_GAIN
    # the same pair just fast enough on the prediction: an even chance, worth a window
    i, gain = _cover([48.0], [10.0], [16], [300.0], t_spread=0.1)
    assert i == 0 and gain == pytest.approx(0.5, abs=0.05)
    # nothing left to cover
    assert _cover([10.0], [10.0], [1], []) == (None, 0.0)
