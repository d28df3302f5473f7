"""Transfer to a new workload / board: the ridge refit, its ONNX export, persistence, and the
torch worker with its fallback."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from predictor_testlib import RESNET_INFER, mape

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.predictor.reference import ReferenceModel, make_session
from powerd.predictor.sampling import select_modes
from powerd.predictor.transfer import (
    FittedPredictor,
    RidgeOptions,
    Samples,
    fit_ridge,
    fit_workload,
)
from powerd.sim.trace import Trace


def profile(trace, idx: np.ndarray) -> Samples:
    return Samples(trace.modes_array[idx], trace.time_ms[idx], trace.power_w[idx])


def front_samples(trace, reference: ReferenceModel, k: int, seed: int = 0) -> Samples:
    pred = reference.predict(trace.modes_array)
    return profile(trace, select_modes("front", trace.modes_array, k, predicted=pred, seed=seed))


@pytest.mark.parametrize("k", [30, 50])
@pytest.mark.parametrize("which", ["mobilenet", "nano"])
def test_refit_beats_reference(reference, request, which: str, k: int) -> None:
    trace = request.getfixturevalue(which)
    s = front_samples(trace, reference, k)
    fp = fit_ridge(s, reference)
    t, p = fp.predict(trace.modes_array)
    t0, p0 = reference.predict(trace.modes_array)
    tm, pm = mape(t, trace.time_ms), mape(p, trace.power_w)
    assert tm < mape(t0, trace.time_ms) / 2
    assert pm < mape(p0, trace.power_w)
    # The product's prediction targets (on every mode of a workload never trained on).
    assert tm <= 15 and pm <= 6, (tm, pm)
    assert fp.method == "ridge"
    assert fp.stats.n_time + len(fp.stats.time_outliers) == k
    assert fp.stats.n_power + len(fp.stats.power_outliers) == k
    assert len(fp.stats.time_outliers) <= k // 10
    assert fp.stats.time_mape < 15 and fp.stats.time_loo_mape is not None


def test_refit_improves_with_random_samples_too(reference, mobilenet) -> None:
    idx = select_modes("random", mobilenet.modes_array, 40, seed=3)
    fp = fit_ridge(profile(mobilenet, idx), reference)
    t, _ = fp.predict(mobilenet.modes_array)
    assert mape(t, mobilenet.time_ms) < 15


def test_fitted_predictor_is_a_strategy_predictor(reference, nano) -> None:
    fp = fit_ridge(front_samples(nano, reference, 20), reference)
    assert isinstance(fp, Predictor)
    t, p = fp.predict(nano.modes_array)
    assert t.shape == p.shape == (len(nano),)
    assert t.dtype == np.float64 and np.all(t > 0)


def test_exported_onnx_equals_numpy_heads(reference, mobilenet) -> None:
    fp = fit_ridge(front_samples(mobilenet, reference, 40), reference)
    t_onnx, p_onnx = fp.predict(mobilenet.modes_array)
    t_np, p_np = fp.predict_with(reference, mobilenet.modes_array)
    np.testing.assert_allclose(t_onnx, t_np, rtol=1e-5)
    np.testing.assert_allclose(p_onnx, p_np, rtol=1e-5)
    # the overall power head (what users are shown) has its numpy twin too
    assert fp.has_overall
    t_all, p_all = fp.predict_overall(mobilenet.modes_array)
    np.testing.assert_array_equal(t_all, t_onnx)
    np.testing.assert_allclose(
        p_all, fp.predict_with(reference, mobilenet.modes_array, overall=True)[1], rtol=1e-5
    )
    model = onnx.load_from_string(fp.onnx_bytes)
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["time_ms", "power_w", "power_overall_w"]
    # A fresh onnxruntime session on the bytes alone (what another process would load).
    t2, p2, _ = make_session(fp.onnx_bytes).run(None, {"modes": mobilenet.modes_array[:50]})
    np.testing.assert_allclose(t2, t_np[:50], rtol=1e-5)
    np.testing.assert_allclose(p2, p_np[:50], rtol=1e-5)


def test_overall_power_head_leaves_decisions_alone(reference, nano) -> None:
    """The overall head is a second output: the power the strategies decide by is the one
    a fit without it has, and only the power users read moves."""
    s = front_samples(nano, reference, 30)
    with_overall = fit_ridge(s, reference)
    without = fit_ridge(s, reference, RidgeOptions(overall_blend=0.0))
    assert with_overall.has_overall and not without.has_overall
    modes = nano.modes_array
    for a, b in zip(with_overall.predict(modes), without.predict(modes), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # without an overall head, what users read is the decision head's power
    np.testing.assert_array_equal(without.predict_overall(modes)[1], without.predict(modes)[1])
    share = with_overall.stats.extra["power_overall_blend"]
    assert 0.0 < share < 1.0
    p_all = with_overall.predict_overall(modes)[1]
    assert np.max(np.abs(p_all - without.predict(modes)[1])) > 0.01
    # its intervals are its own and hold its prediction
    _, _, _, p, lo, hi = with_overall.predict_interval(modes, overall=True)
    np.testing.assert_array_equal(p, p_all)
    assert np.all((lo <= p) & (p <= hi))
    assert with_overall.stats.power_overall_halfwidth_rel is not None


def test_save_load_round_trip(reference, nano, tmp_path: Path) -> None:
    fp = fit_ridge(front_samples(nano, reference, 30), reference)
    fp.save(tmp_path / "fit")
    assert {p.name for p in (tmp_path / "fit").iterdir()} == {
        "predictor.onnx",
        "fit.npz",
        "fitted.json",
    }
    # Strict JSON (jq and other tools reject NaN/Infinity tokens).
    meta = json.loads(
        (tmp_path / "fit" / "fitted.json").read_text(),
        parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"),
    )
    assert meta["method"] == "ridge" and meta["reference_id"] == reference.model_id
    back = FittedPredictor.load(tmp_path / "fit")
    for a, b in zip(fp.predict(nano.modes_array), back.predict(nano.modes_array), strict=True):
        np.testing.assert_array_equal(a, b)
    assert back.method == fp.method == "ridge"
    assert back.reference_id == reference.model_id
    assert back.stats.time_mape == pytest.approx(fp.stats.time_mape)
    assert back.stats.lambda_time == fp.stats.lambda_time
    np.testing.assert_array_equal(back.samples.modes, fp.samples.modes)
    np.testing.assert_array_equal(back.samples.power_w, fp.samples.power_w)
    assert back.heads is not None and fp.heads is not None
    np.testing.assert_array_equal(back.heads[0].w, fp.heads[0].w)
    assert back.has_overall and len(back.heads) == len(fp.heads) == 3
    np.testing.assert_array_equal(
        back.predict_overall(nano.modes_array)[1], fp.predict_overall(nano.modes_array)[1]
    )
    np.testing.assert_allclose(
        back.predict_with(reference, nano.modes_array[:20], overall=True)[1],
        fp.predict_overall(nano.modes_array[:20])[1],
        rtol=1e-5,
    )
    assert back.stats.power_overall_halfwidth_rel == fp.stats.power_overall_halfwidth_rel
    np.testing.assert_allclose(
        back.predict_with(reference, nano.modes_array[:20])[0],
        fp.predict(nano.modes_array[:20])[0],
        rtol=1e-5,
    )


def test_saved_fit_survives_without_reference_dir(reference, nano, tmp_path: Path) -> None:
    # A persisted fit must not depend on the bundled model (an upgrade may replace it).
    fp = fit_ridge(front_samples(nano, reference, 20), reference)
    fp.save(tmp_path / "fit")
    shutil.copytree(tmp_path / "fit", tmp_path / "moved")
    back = FittedPredictor.load(tmp_path / "moved")
    np.testing.assert_array_equal(
        back.predict(nano.modes_array)[0], fp.predict(nano.modes_array)[0]
    )


def test_load_rejects_garbage(tmp_path: Path) -> None:
    (tmp_path / "fitted.json").write_text("{}")
    with pytest.raises(ValueError, match="not a saved powerd predictor"):
        FittedPredictor.load(tmp_path)


def test_nan_time_is_used_for_power_only(reference, mobilenet) -> None:
    s = front_samples(mobilenet, reference, 30)
    t = s.time_ms.copy()
    t[:5] = np.nan
    fp = fit_ridge(Samples(s.modes, t, s.power_w), reference)
    assert fp.stats.n_time + len(fp.stats.time_outliers) == 25
    assert fp.stats.n_power + len(fp.stats.power_outliers) == 30
    assert not set(fp.stats.time_outliers) & set(range(5))  # indices of measured samples
    assert np.all(np.isfinite(fp.predict(mobilenet.modes_array)[0]))


def test_an_aborted_window_never_trains_time_and_bounds_power_from_below(
    reference, mobilenet
) -> None:
    rows = mobilenet.rows[:12]
    ms = {r.mode: Measurement(r.mode, r.time_ms, r.power_w, steps=5) for r in rows}
    m0 = PowerMode(*mobilenet.modes_array[100].tolist())
    plain = fit_workload(ms, reference, method="ridge")
    (p_plain,) = plain.predict(np.array([m0.as_tuple()]))[1]
    # A bound the fit already respects stays out of it.
    low = dict(ms)
    low[m0] = Measurement(m0, math.nan, p_plain - 3.0, aborted_over_budget=True)
    fp = fit_workload(low, reference, method="ridge")
    assert fp.stats.n_time == 12 and fp.stats.n_power == 12
    assert len(fp.samples) == 13
    # One the fit breaks is taken as measured: the power model learns where it was wrong.
    high = dict(ms)
    high[m0] = Measurement(m0, math.nan, p_plain + 10.0, aborted_over_budget=True)
    fp = fit_workload(high, reference, method="ridge")
    assert fp.stats.n_time == 12 and fp.stats.n_power == 13
    assert fp.stats.extra["power_floors"] == 1
    (p_high,) = fp.predict(np.array([m0.as_tuple()]))[1]
    assert p_high > p_plain + 5.0, (p_plain, p_high)


def test_power_floor_corrects_an_extrapolating_fit(reference, nano) -> None:
    # Orin Nano, a 9 W first budget: every sample at 2 cores and a low CPU clock. The
    # next budget's first pick (2 cores, 1036 MHz) ran 6 W over its prediction and was
    # cut short; its neighbour one GPU step down must not be predicted as cheap again.
    low = [
        (2, 268800, 306000000, 665600000),
        (2, 422400, 306000000, 665600000),
        (2, 268800, 306000000, 2133000000),
        (2, 268800, 510000000, 665600000),
        (2, 268800, 510000000, 2133000000),
        (2, 268800, 624750000, 665600000),
        (2, 268800, 624750000, 2133000000),
        (4, 268800, 306000000, 665600000),
    ]
    ms = {}
    for t in low:
        r = nano.lookup(PowerMode(*t))
        ms[r.mode] = Measurement(r.mode, r.time_ms, r.power_w, steps=10)
    over = nano.lookup(PowerMode(2, 1036800, 624750000, 2133000000))
    nb = nano.lookup(PowerMode(2, 1036800, 510000000, 2133000000))
    at = np.array([nb.mode.as_tuple()])
    (before,) = fit_workload(ms, reference, method="ridge").predict(at)[1]
    ms[over.mode] = Measurement(over.mode, math.nan, over.power_w, aborted_over_budget=True)
    lifted = fit_workload(ms, reference, method="ridge")
    (after,) = lifted.predict(at)[1]
    assert before < nb.power_w - 3.0  # the situation: a fit far too low out there
    assert abs(after - nb.power_w) < 1.5, (before, after, nb.power_w)
    # a reading this far out tilts the fit past the bound on the reference's slope
    assert lifted.heads[1].coef_ref > 1.2


@pytest.mark.parametrize("k", [1, 2, 3])
def test_few_samples_rescale_the_reference(reference, nano, k: int) -> None:
    # (From 4 samples on, the physical time head fits which resource the time goes to.)
    s = profile(nano, np.arange(k) * 17)
    fp = fit_ridge(s, reference)
    t, p = fp.predict(nano.modes_array)
    t0, p0 = reference.predict(nano.modes_array)
    assert np.all(np.isfinite(t)) and np.all(np.isfinite(p))
    # Scale-only fit: the reference's ranking of time is kept exactly.
    np.testing.assert_allclose(np.log(t) - np.log(t0), np.log(t[0]) - np.log(t0[0]), atol=1e-4)


def test_fit_requires_samples(reference) -> None:
    with pytest.raises(ValueError, match="without samples"):
        fit_workload((np.zeros((0, 4), dtype=np.int64), [], []), reference)
    with pytest.raises(ValueError, match="unknown fit method"):
        fit_workload(
            (np.array([[4, 729600, 624750000, 2133000000]]), [100.0], [20.0]),
            reference,
            method="magic",
        )


def test_ridge_fit_predicts_a_full_mode_space(reference, mobilenet) -> None:
    # its speed is a benchmark figure (tools/bench_predictor.py), not asserted here
    s = front_samples(mobilenet, reference, 50)
    t, p = fit_ridge(s, reference).predict(mobilenet.modes_array)
    assert np.all(np.isfinite(t)) and np.all(t > 0) and np.all(np.isfinite(p))


def python_without_torch() -> str | None:
    for exe in ("/usr/bin/python3", shutil.which("python3") or ""):
        if not exe or not Path(exe).exists():
            continue
        r = subprocess.run([exe, "-c", "import torch"], capture_output=True, timeout=60)
        if r.returncode != 0:
            return exe
    return None


def test_fallback_to_ridge_when_interpreter_lacks_torch(reference, nano) -> None:
    exe = python_without_torch()
    if exe is None:
        pytest.skip("every python3 here has torch")
    s = front_samples(nano, reference, 20)
    fp = fit_workload(s, reference, python=exe, method="torch-finetune")
    assert fp.method == "ridge"
    assert "torch" in fp.stats.fallback_reason and exe in fp.stats.fallback_reason
    ridge = fit_ridge(s, reference)
    np.testing.assert_allclose(fp.predict(nano.modes_array)[0], ridge.predict(nano.modes_array)[0])


def test_fallback_when_interpreter_missing(reference, nano) -> None:
    s = front_samples(nano, reference, 10)
    fp = fit_workload(s, reference, python="/nonexistent/python3")  # default: torch-finetune
    assert fp.method == "ridge" and "not found" in fp.stats.fallback_reason


def test_ridge_method_runs_no_subprocess(reference, nano) -> None:
    fp = fit_workload(
        front_samples(nano, reference, 10), reference, python="/nonexistent/py", method="ridge"
    )
    assert fp.method == "ridge" and fp.stats.fallback_reason == ""


def test_torch_worker_fine_tunes_and_exports(reference, nano, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    s = front_samples(nano, reference, 30)
    # A workload 30x faster than the reference's: the worker must get the scale right.
    s = Samples(s.modes, s.time_ms / 30, s.power_w)
    fp = fit_workload(s, reference, method="torch-finetune")
    t, p = fp.predict(nano.modes_array)
    assert fp.method == "torch-finetune", fp.stats.fallback_reason
    assert mape(t, nano.time_ms / 30) < 15
    assert mape(p, nano.power_w) < 6
    n_out = len(fp.stats.time_outliers)
    assert fp.stats.extra["worker"]["n_time"] == 30 - n_out  # ridge-screened outliers out
    assert fp.stats.time_mape < 5  # in-sample
    fp.save(tmp_path)
    back = FittedPredictor.load(tmp_path)
    assert back.method == "torch-finetune" and back.heads is None
    np.testing.assert_array_equal(back.predict(nano.modes_array)[1], p)


def test_too_few_samples_for_torch_use_the_ridge(reference, nano) -> None:
    fp = fit_workload(front_samples(nano, reference, 6), reference, method="torch-finetune")
    assert fp.method == "ridge" and "fine-tuning needs" in fp.stats.fallback_reason


def test_gross_anomaly_is_left_out(reference, mobilenet) -> None:
    idx = select_modes("random", mobilenet.modes_array, 40, seed=7)
    s = profile(mobilenet, idx)
    t = s.time_ms.copy()
    t[3] *= 4.0  # e.g. a step time measured across a checkpoint write
    fp = fit_ridge(Samples(s.modes, t, s.power_w), reference)
    clean = fit_ridge(s, reference)
    assert 3 in fp.stats.time_outliers
    assert fp.stats.n_time == 40 - len(fp.stats.time_outliers)
    pred = fp.predict(mobilenet.modes_array)[0]
    assert (
        mape(pred, mobilenet.time_ms)
        < mape(clean.predict(mobilenet.modes_array)[0], mobilenet.time_ms) + 1.0
    )


def test_no_trimming_below_min_samples(reference, nano) -> None:
    s = profile(nano, np.arange(15) * 11)
    t = s.time_ms.copy()
    t[0] *= 4.0
    fp = fit_ridge(Samples(s.modes, t, s.power_w), reference)
    assert fp.stats.time_outliers == [] and fp.stats.n_time == 15


# A 16 W budget's profiled modes of ResNet-18 inference at batch size 16 (its modes span
# 15-54 W) and their power as read in a replay (the trace's power plus ~0.2 W noise): every
# reading within 1.7 W of the others, so a free slope on the reference's power is the tilt
# of a few noisy points.
LOW_BUDGET_READINGS = {
    (4, 422400, 114750000, 665600000): 14.69,
    (8, 729600, 114750000, 665600000): 15.38,
    (4, 422400, 318750000, 665600000): 16.38,
    (4, 422400, 114750000, 2133000000): 16.23,
    (4, 1036800, 114750000, 665600000): 15.30,
    (8, 1036800, 114750000, 665600000): 15.51,
    (12, 422400, 114750000, 665600000): 15.14,
}


def test_power_slope_bound_keeps_a_low_budgets_fit_from_tilting(reference) -> None:
    trace = Trace.load(RESNET_INFER, batch_size=16)
    modes = np.array(list(LOW_BUDGET_READINGS))
    true = [trace.lookup(PowerMode(*m)) for m in LOW_BUDGET_READINGS]
    s = Samples(modes, [r.time_ms for r in true], list(LOW_BUDGET_READINGS.values()))
    # free: neither the bound nor the floor on the activations' ridge strength (which
    # alone holds this slope to 1.26)
    free = fit_ridge(
        s,
        reference,
        RidgeOptions(power_model="ridge", power_max_slope=0.0, power_min_lambda=0.0),
    )
    bound = fit_ridge(s, reference, RidgeOptions(power_model="ridge"))
    assert RidgeOptions().power_max_slope == 1.1
    assert free.heads[1].coef_ref > 1.3  # the situation: the free slope overshoots
    assert 1.05 < bound.heads[1].coef_ref < 1.15
    # near the samples both fit; over every mode the bounded one is far closer
    assert mape(bound.predict(s.modes)[1], s.power_w) < 3.0
    assert mape(bound.predict(trace.modes_array)[1], trace.power_w) < 6.0
    assert mape(free.predict(trace.modes_array)[1], trace.power_w) > 12.0


def test_power_slope_bound_leaves_a_flatter_fit_alone(reference, nano) -> None:
    s = front_samples(nano, reference, 30)
    free = fit_ridge(s, reference, RidgeOptions(power_model="ridge", power_max_slope=0.0))
    bound = fit_ridge(s, reference, RidgeOptions(power_model="ridge"))
    assert free.heads[1].coef_ref < 1.1
    np.testing.assert_allclose(
        bound.predict(nano.modes_array)[1], free.predict(nano.modes_array)[1], rtol=1e-9
    )


# A 14 W budget's profiled modes of MobileNet v3 training on Orin AGX (its modes span
# 12-44 W) as a replay read them: step time (ms), power (W) and, for a window cut short
# over the budget, the power it had reached (a floor). Every full reading lies within
# 3.4 W of the others, at the lowest CPU clocks.
LOW_CLOCK_READINGS = {
    (2, 268800, 216750000, 204000000): (3323.7, 11.54, math.nan),
    (4, 268800, 114750000, 204000000): (1196.4, 13.15, math.nan),
    (2, 422400, 114750000, 204000000): (1763.5, 12.49, math.nan),
    (2, 268800, 318750000, 665600000): (2647.6, 11.96, math.nan),
    (2, 729600, 114750000, 665600000): (840.0, 14.20, math.nan),
    (4, 268800, 114750000, 665600000): (1000.4, 13.80, math.nan),
    (10, 576000, 114750000, 665600000): (814.2, 14.25, math.nan),
    (12, 422400, 114750000, 204000000): (1099.8, 13.40, math.nan),
    (6, 576000, 114750000, 665600000): (777.9, 14.26, math.nan),
    (4, 576000, 114750000, 665600000): (792.0, 14.47, math.nan),
    (8, 422400, 114750000, 665600000): (802.6, 13.99, math.nan),
    (12, 422400, 114750000, 665600000): (797.1, 14.26, math.nan),
    (2, 268800, 1300500000, 2133000000): (math.nan, math.nan, 18.64),
    (6, 268800, 420750000, 665600000): (math.nan, math.nan, 15.24),
    (10, 268800, 318750000, 665600000): (math.nan, math.nan, 15.80),
    (4, 422400, 420750000, 665600000): (math.nan, math.nan, 16.56),
    (6, 268800, 216750000, 665600000): (568.9, 14.99, math.nan),
    (4, 268800, 318750000, 2133000000): (678.2, 14.89, math.nan),
    (4, 268800, 216750000, 3199000000): (math.nan, math.nan, 16.29),
    (4, 268800, 216750000, 2133000000): (655.1, 14.68, math.nan),
    (6, 422400, 114750000, 2133000000): (math.nan, math.nan, 15.29),
    (4, 268800, 726750000, 665600000): (717.6, 14.75, math.nan),
    (4, 268800, 522750000, 665600000): (729.8, 14.40, math.nan),
    (4, 268800, 420750000, 665600000): (695.7, 14.15, math.nan),
    (4, 268800, 318750000, 665600000): (842.1, 13.96, math.nan),
}


def test_power_activations_keep_a_floor_on_their_ridge_strength(reference, mobilenet) -> None:
    """Bunched samples let the leave-one-out pick a weak penalty that bends the ridge
    head to them; the floor keeps it, and with it the whole mode space, near the
    reference's shape (before: the physical power terms won the block score and read
    every mode's power 27.5 % off)."""
    modes = np.array(list(LOW_CLOCK_READINGS))
    t, p, floor = np.array(list(LOW_CLOCK_READINGS.values())).T
    s = Samples(modes, t, p, floor)
    unfloored = fit_ridge(s, reference, RidgeOptions(power_min_lambda=0.0))
    fp = fit_ridge(s, reference)
    assert RidgeOptions().power_min_lambda == 30.0
    assert unfloored.stats.extra.get("power_form") == "physical"  # the situation
    assert fp.stats.lambda_power is not None and fp.stats.lambda_power >= 30.0
    # both fit the readings; over every mode only the floored fit stays close
    assert mape(fp.predict(s.modes)[1][s.power_ok], p[s.power_ok]) < 3.0
    assert mape(fp.predict(mobilenet.modes_array)[1], mobilenet.power_w) < 7.0
    assert mape(unfloored.predict(mobilenet.modes_array)[1], mobilenet.power_w) > 20.0
