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


@pytest.fixture(scope="module")
def resnet_infer():
    from predictor_testlib import TRACES

    from powerd.sim.trace import Trace

    return Trace.load(TRACES / "orin_agx_resnet18_imagenet_infer.csv", batch_size=1)


def low_power_samples(trace, k: int, seed: int = 0) -> Samples:
    """What a low budget profiles: only modes in the lowest third of the workload's power."""
    from powerd.predictor.sampling import select_modes

    low = np.flatnonzero(trace.power_w <= np.quantile(trace.power_w, 0.35))
    idx = low[select_modes("grid", trace.modes_array[low], k, seed=seed)]
    return Samples(trace.modes_array[idx], trace.time_ms[idx], trace.power_w[idx])


@pytest.mark.parametrize("which", ["mobilenet", "resnet_infer"])
def test_intervals_widen_away_from_the_profiled_region(reference, request, which: str) -> None:
    trace = request.getfixturevalue(which)
    s = low_power_samples(trace, 25)
    fp = fit_ridge(s, reference)
    t, t_lo, t_hi, p, p_lo, p_hi = fp.predict_interval(trace.modes_array)
    high = trace.power_w >= np.quantile(trace.power_w, 0.8)  # far from every sample
    sampled = np.isin(
        trace.modes_array.view([("", trace.modes_array.dtype)] * 4),
        s.modes.view([("", s.modes.dtype)] * 4),
    ).ravel()
    assert np.median((t_hi / t)[high]) > np.median((t_hi / t)[sampled])
    assert np.median((p_hi / p)[high]) > np.median((p_hi / p)[sampled])
    # and they still hold most true values over the whole grid (nominal 90 %; the previous
    # release's fixed-width intervals held 74 % of MobileNet's true times and 59 % of
    # ResNet-18 inference's true powers on these very samples)
    assert np.mean((trace.time_ms >= t_lo) & (trace.time_ms <= t_hi)) >= 0.85
    assert np.mean((trace.power_w >= p_lo) & (trace.power_w <= p_hi)) >= 0.7


def test_fits_saved_before_distance_scaling_keep_their_intervals(reference, nano) -> None:
    from dataclasses import replace as dc_replace

    fp = fit_ridge(spread_samples(nano, 30), reference)
    legacy = dc_replace(fp.stats, interval_growth=None, time_halfwidth=0.1, power_halfwidth_w=0.5)
    fp.stats = legacy
    t, t_lo, t_hi, p, p_lo, p_hi = fp.predict_interval(nano.modes_array)
    np.testing.assert_allclose(t_hi, t * np.exp(1.5 * 0.1))
    np.testing.assert_allclose(p_lo, p - 1.5 * 0.5)


def test_intervals_are_bounded_even_from_a_handful_of_samples(reference, mobilenet) -> None:
    from powerd.predictor.transfer import INTERVAL_MAX_LOG

    fp = fit_ridge(low_power_samples(mobilenet, 6), reference)
    t, t_lo, t_hi, p, p_lo, p_hi = fp.predict_interval(mobilenet.modes_array)
    assert np.all(np.isfinite(t_hi)) and np.all(t_lo > 0)
    assert np.max(np.log(t_hi / t)) <= INTERVAL_MAX_LOG + 1e-9
    assert np.max(np.log(p_hi / p)) <= INTERVAL_MAX_LOG + 1e-9


def front_heavy_samples(trace, seed: int) -> Samples:
    """What a workload has measured after many budget changes: a spread first profile, then
    mostly the modes its picks went to (here the true front), read with little noise."""
    from powerd.predictor.sampling import select_modes

    order = np.argsort(trace.power_w)
    front = order[np.minimum.accumulate(trace.time_ms[order]) == trace.time_ms[order]]
    idx = np.union1d(select_modes("grid", trace.modes_array, 30, seed=seed), front)
    rng = np.random.default_rng(seed)
    t = trace.time_ms[idx] * (1 + 0.006 * rng.standard_normal(len(idx)))
    p = trace.power_w[idx] * (1 + 0.002 * rng.standard_normal(len(idx)))
    return Samples(trace.modes_array[idx], t, p)


def test_power_intervals_hold_where_the_samples_crowd_the_front(reference, mobilenet) -> None:
    # Most samples near the front and close to each other: their leave-one-out misses are
    # small, the misses far from them are not. With the power intervals growing as fast as
    # the time ones (INTERVAL_GROWTH_POWER 1) these held 84-91 % of the true powers (mean
    # 87 %) on these three sets; at 2, 89-95 % (mean 92 %).
    covers = []
    for seed in range(3):
        s = front_heavy_samples(mobilenet, seed)
        assert len(s) > 150  # the front is most of it
        _, _, _, _, p_lo, p_hi = fit_ridge(s, reference).predict_interval(
            mobilenet.modes_array, overall=True
        )
        covers.append(np.mean((mobilenet.power_w >= p_lo) & (mobilenet.power_w <= p_hi)))
    assert np.mean(covers) >= 0.9, covers
    assert min(covers) >= 0.88, covers
