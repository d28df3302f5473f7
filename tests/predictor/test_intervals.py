"""Per-mode uncertainty of a fitted predictor: split-conformal intervals from the ridge's
leave-one-out residuals, judged against the true trace."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.predictor.transfer import (
    INTERVAL_COVERAGE,
    Samples,
    conformal_halfwidth,
    fit_ridge,
)


def spread_samples(trace, k: int, seed: int = 0) -> Samples:
    idx = np.random.default_rng(seed).choice(len(trace), size=k, replace=False)
    return Samples(trace.modes_array[idx], trace.time_ms[idx], trace.power_w[idx])


def test_conformal_halfwidth_is_the_right_order_statistic() -> None:
    resid = np.array([0.1, -0.5, 0.2, 0.05, -0.3, 0.4, 0.15, -0.25, 0.35])  # n = 9
    # ceil(10 * 0.9) = 9th smallest |r| = 0.5; at 0.5: ceil(5) = 5th = 0.25
    assert conformal_halfwidth(resid, 0.9) == pytest.approx(0.5)
    assert conformal_halfwidth(resid, 0.5) == pytest.approx(0.25)
    assert conformal_halfwidth(resid[:3]) is None


@pytest.mark.parametrize("which", ["mobilenet", "nano"])
def test_intervals_bracket_predictions_and_cover_most_true_values(
    reference, request, which: str
) -> None:
    trace = request.getfixturevalue(which)
    fp = fit_ridge(spread_samples(trace, 40), reference)
    t, t_lo, t_hi, p, p_lo, p_hi = fp.predict_interval(trace.modes_array)
    assert np.all(t_lo < t) and np.all(t < t_hi) and np.all(p_lo < p) and np.all(p < p_hi)
    # samples spread over the grid: the nominal coverage holds roughly over every mode
    cover_t = np.mean((trace.time_ms >= t_lo) & (trace.time_ms <= t_hi))
    cover_p = np.mean((trace.power_w >= p_lo) & (trace.power_w <= p_hi))
    assert cover_t >= INTERVAL_COVERAGE - 0.15, cover_t
    assert cover_p >= INTERVAL_COVERAGE - 0.15, cover_p
    # and they are informative, not the whole range
    assert np.median(t_hi / t_lo) < 2.0
    assert np.median(p_hi - p_lo) < 0.5 * (trace.power_w.max() - trace.power_w.min())


def test_too_few_samples_give_no_interval(reference, nano) -> None:
    fp = fit_ridge(spread_samples(nano, 3), reference)
    _, t_lo, t_hi, _, p_lo, _ = fp.predict_interval(nano.modes_array[:5])
    assert np.all(np.isnan(t_lo)) and np.all(np.isnan(t_hi)) and np.all(np.isnan(p_lo))


def test_halfwidths_survive_save_and_load(reference, nano, tmp_path) -> None:
    from powerd.predictor.transfer import FittedPredictor

    fp = fit_ridge(spread_samples(nano, 30), reference)
    back = FittedPredictor.load(fp.save(tmp_path / "fit"))
    a, b = fp.predict_interval(nano.modes_array), back.predict_interval(nano.modes_array)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5)
