"""The physical power head of the transfer (powerd.predictor.physical.power_design, Head
"physical-power"): non-negative power terms (clock terms, and per-step terms divided by the
fitted step time) plus the reference's power, the activations on top; the exported graph, a
save/load and the numpy heads agree, on bunched samples it extrapolates where the
reference's power shape does not fit the workload, and from a low budget's samples the
per-step terms extrapolate to the top clocks where the clock terms alone overshoot."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from predictor_testlib import LOW_CORNER, TRACES, mape

from powerd.modes import PowerMode
from powerd.predictor import physical
from powerd.predictor.features import PHYSICAL_POWER, PHYSICAL_POWER_PER_STEP
from powerd.predictor.transfer import (
    FittedPredictor,
    RidgeOptions,
    Samples,
    blend_power_heads,
    blend_weight,
    fit_ridge,
)
from powerd.sim.trace import Trace

PHYSICAL = replace(RidgeOptions(), power_model="physical")
RIDGE = replace(RidgeOptions(), power_model="ridge")
CLOCK_TERMS_ONLY = replace(PHYSICAL, power_per_step=0)


@pytest.fixture(scope="module")
def resnet_infer() -> Trace:
    return Trace.load(TRACES / "orin_agx_resnet18_imagenet_infer.csv", batch_size=1)


def bunched(trace: Trace, seed: int = 0) -> Samples:
    """30 modes as a budget sweep's picks bunch: most at the top CPU clock, a few spread."""
    rng = np.random.default_rng(seed)
    modes = trace.modes_array
    top = np.flatnonzero(modes[:, 1] == modes[:, 1].max())
    rest = np.flatnonzero(modes[:, 1] != modes[:, 1].max())
    idx = np.concatenate([rng.choice(top, 22, replace=False), rng.choice(rest, 8, replace=False)])
    return Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx])


def test_power_terms_have_non_negative_weights_and_rise_with_every_clock(resnet_infer) -> None:
    s = bunched(resnet_infer)
    x = physical.power_design(s.modes, s.power_w)  # any positive reference column will do
    c = physical.fit_weights(x, s.power_w)
    assert (c >= 0).all() and c.shape == (len(PHYSICAL_POWER) + 1,)
    # with non-negative weights the terms part can only grow with a clock or a core
    lo = np.array([[4, 1_000_000, 500_000_000, 2_000_000_000]])
    for j, step in ((0, 4), (1, 500_000), (2, 300_000_000), (3, 1_000_000_000)):
        hi = lo.copy()
        hi[0, j] += step
        d = physical.power_design(hi, [0.0]) - physical.power_design(lo, [0.0])
        assert (d[0] >= -1e-12).all()
    # the per-step terms: power = energy per step / step time, so a step that takes twice as
    # long at the same mode draws half their power
    x1 = physical.power_design(lo, [0.0], np.array([10.0]))
    x2 = physical.power_design(lo, [0.0], np.array([20.0]))
    n = len(PHYSICAL_POWER)
    assert x1.shape == (1, n + len(PHYSICAL_POWER_PER_STEP) + 1)
    np.testing.assert_allclose(x2[0, n:-1], x1[0, n:-1] / 2)
    np.testing.assert_array_equal(x2[0, :n], x1[0, :n])


def test_physical_power_head_is_the_same_in_the_graph_numpy_and_after_a_reload(
    reference, resnet_infer, tmp_path
) -> None:
    modes = resnet_infer.modes_array
    fp = fit_ridge(bunched(resnet_infer), reference, PHYSICAL)
    assert fp.heads is not None and fp.heads[1].ref_transform == "physical-power"
    assert fp.stats.extra.get("power_form") == "physical"
    np.testing.assert_allclose(
        fp.predict_with(reference, modes)[1], fp.predict(modes)[1], rtol=1e-4
    )
    back = FittedPredictor.load(fp.save(tmp_path / "fit"))
    np.testing.assert_array_equal(back.predict(modes)[1], fp.predict(modes)[1])
    assert back.heads is not None
    np.testing.assert_array_equal(back.heads[1].phys_coef, fp.heads[1].phys_coef)
    assert fp.heads[1].needs_time and fp.heads[1].phys_coef[fp.heads[1].phys_per_step].any()
    np.testing.assert_array_equal(back.heads[1].phys_per_step, fp.heads[1].phys_per_step)
    np.testing.assert_allclose(
        back.predict_with(reference, modes)[1], fp.predict(modes)[1], rtol=1e-4
    )


def test_from_a_low_budgets_samples_the_per_step_terms_extrapolate_to_the_top_clocks(
    reference, resnet_infer
) -> None:
    # ResNet-18 inference at batch size 1, 20 modes under 17 W (the trace spans 12.8-26.9 W).
    # The step is launch-bound: a faster GPU clock hardly shortens it, so the GPU spends
    # about the same energy per step and draws little more. Clock terms alone carry the
    # slope of the low clocks to the top ones.
    modes, true_p = resnet_infer.modes_array, resnet_infer.power_w
    top = modes[:, 2] == modes[:, 2].max()
    low = np.flatnonzero(true_p <= 17.0)
    err: dict[str, list[float]] = {"per-step": [], "clock": [], "per-step top": [], "clock top": []}
    for seed in range(3):
        idx = np.random.default_rng(seed).choice(low, 20, replace=False)
        s = Samples(modes[idx], resnet_infer.time_ms[idx], true_p[idx])
        for name, opts in (("per-step", PHYSICAL), ("clock", CLOCK_TERMS_ONLY)):
            p = fit_ridge(s, reference, opts).predict(modes)[1]
            err[name].append(mape(p, true_p))
            err[f"{name} top"].append(mape(p[top], true_p[top]))
    mean = {k: float(np.mean(v)) for k, v in err.items()}
    assert mean["per-step"] < 0.75 * mean["clock"], mean
    assert mean["per-step top"] < 0.75 * mean["clock top"], mean
    assert mean["per-step"] < 3.0, mean


def test_on_bunched_samples_the_physical_power_head_extrapolates_better(
    reference, resnet_infer
) -> None:
    # ResNet-18 inference at batch size 1: even the best affine map of the reference's
    # power over every mode is ~6 % off, so a head built on it alone drifts away from the
    # samples; the power terms follow the workload's own clocks.
    modes, true_p = resnet_infer.modes_array, resnet_infer.power_w
    old, new = [], []
    for seed in range(3):
        s = bunched(resnet_infer, seed)
        old.append(mape(fit_ridge(s, reference, RIDGE).predict(modes)[1], true_p))
        new.append(mape(fit_ridge(s, reference, PHYSICAL).predict(modes)[1], true_p))
    assert np.mean(new) < np.mean(old), (new, old)
    assert np.mean(new) < 6.0, new


# What powertrain measured for a new ResNet-18 inference job (batch size 1) at 15 W in a
# replay (noise seed 0, session 24): every mode at the two lowest GPU clocks.
AT_15_W = [
    (4, 422400, 114750000, 665600000), (4, 2201600, 114750000, 665600000),
    (8, 729600, 114750000, 665600000), (4, 422400, 318750000, 665600000),
    (4, 422400, 114750000, 2133000000), (12, 1036800, 114750000, 665600000),
    (8, 1344000, 114750000, 665600000), (4, 1651200, 114750000, 665600000),
    (12, 1651200, 114750000, 665600000), (4, 1958400, 114750000, 665600000),
    (8, 1958400, 114750000, 665600000), (8, 1036800, 114750000, 2133000000),
    (4, 1344000, 318750000, 665600000), (4, 1036800, 318750000, 665600000),
    (8, 729600, 318750000, 665600000), (8, 1036800, 318750000, 665600000),
    (12, 729600, 318750000, 665600000),
]  # fmt: skip


def test_a_knob_sampled_at_two_levels_gets_no_curved_power_terms(reference, resnet_infer) -> None:
    # Two levels show a slope, not a curve: with the GPU's curved terms (f^3, and f^2 per
    # step) fitted to them the top GPU clock read ~14 W high and the fit was ~28 % off
    # over every mode.
    trace = resnet_infer
    rows = [trace.lookup(PowerMode(*m)) for m in AT_15_W]
    s = Samples(np.array(AT_15_W), [r.time_ms for r in rows], [r.power_w for r in rows])
    fp = fit_ridge(s, reference, PHYSICAL)
    head = fp.heads[1]  # type: ignore[index]
    curved_gpu = head.phys_exps[:, 2] > 1
    assert curved_gpu.any() and not head.phys_coef[curved_gpu].any()
    assert mape(fp.predict(trace.modes_array)[1], trace.power_w) < 8.0


def test_an_unknown_power_model_is_refused(reference, resnet_infer) -> None:
    with pytest.raises(ValueError, match="power model"):
        fit_ridge(bunched(resnet_infer), reference, replace(RidgeOptions(), power_model="x"))


def test_auto_keeps_the_head_that_extrapolates_better(reference, resnet_infer, nano) -> None:
    # Orin Nano, a low budget's view: every sample under 12 W. Fitted to them the clock
    # terms alone extrapolate over the grid worse than the rescaled reference; leaving one
    # clock level out at a time shows it, and "auto" keeps the ridge head. With the
    # per-step terms the power terms are the better of the two, and "auto" keeps them.
    low = np.flatnonzero(nano.power_w <= 12.0)[::3]
    s = Samples(nano.modes_array[low], nano.time_ms[low], nano.power_w[low])
    # A blend ("auto" with power_blend) gives the worse head the smaller share, and
    # predicts better than it.
    for terms, worse_head in ((CLOCK_TERMS_ONLY, "physical-power"), (PHYSICAL, "identity")):
        fits = {
            "auto": fit_ridge(s, reference, replace(terms, power_model="auto", power_blend=0)),
            "blend": fit_ridge(s, reference, replace(terms, power_model="auto", power_blend=2)),
            "physical-power": fit_ridge(s, reference, terms),
            "identity": fit_ridge(s, reference, replace(terms, power_model="ridge")),
        }
        err = {k: mape(fp.predict(nano.modes_array)[1], nano.power_w) for k, fp in fits.items()}
        auto_head = fits["auto"].heads[1].ref_transform  # type: ignore[index]
        assert auto_head != worse_head and err[worse_head] > err[auto_head], (terms, err)
        share = fits["blend"].stats.extra["power_blend"]
        assert (share < 0.5) == (worse_head == "physical-power"), (terms, share)
        assert err["blend"] < err[worse_head], (terms, err)
    # ResNet-18 inference's bunched samples: the reference's shape is the worse one there
    fp = fit_ridge(
        bunched(resnet_infer), reference, replace(RidgeOptions(), power_model="auto", power_blend=0)
    )
    assert fp.heads is not None and fp.heads[1].ref_transform == "physical-power"


def test_blend_weights_follow_the_block_errors() -> None:
    # inverse errors to the power: equal errors share alike; twice the error, a quarter
    assert blend_weight([0.02, 0.02], 2.0) == pytest.approx(0.5)
    assert blend_weight([0.02, 0.04], 2.0) == pytest.approx(0.2)
    assert blend_weight([0.04, 0.02], 1.0) == pytest.approx(2 / 3)
    # no blend: switched off, or a head that could not be scored
    assert blend_weight([0.02, 0.04], 0.0) is None
    assert blend_weight([0.02, float("inf")], 2.0) is None


def test_a_blended_head_is_the_mix_of_its_two_heads(reference, resnet_infer) -> None:
    s = bunched(resnet_infer)
    ridge, phys = (
        fit_ridge(s, reference, RIDGE).heads[1],
        fit_ridge(s, reference, PHYSICAL).heads[1],
    )
    assert ridge.ref_transform == "identity" and phys.ref_transform == "physical-power"
    e = reference.embed(resnet_infer.modes_array)
    t = resnet_infer.time_ms  # any positive step times: the per-step terms divide by them
    both = [h.apply(e.power_y, e.power_h, resnet_infer.modes_array, t) for h in (ridge, phys)]
    for alpha in (0.0, 0.3, 1.0):
        mixed = blend_power_heads(ridge, phys, alpha)
        np.testing.assert_allclose(
            mixed.apply(e.power_y, e.power_h, resnet_infer.modes_array, t),
            (1 - alpha) * both[0] + alpha * both[1],
            rtol=1e-9,
        )
    with pytest.raises(ValueError, match="blend"):
        blend_power_heads(phys, ridge, 0.5)


def test_a_blend_fit_is_the_same_in_the_graph_numpy_and_after_a_reload(
    reference, resnet_infer, tmp_path
) -> None:
    modes = resnet_infer.modes_array
    fp = fit_ridge(bunched(resnet_infer), reference, replace(RidgeOptions(), power_blend=2.0))
    assert fp.stats.extra.get("power_form") == "blend"
    assert 0.0 < fp.stats.extra["power_blend"] < 1.0
    np.testing.assert_allclose(
        fp.predict_with(reference, modes)[1], fp.predict(modes)[1], rtol=1e-4
    )
    back = FittedPredictor.load(fp.save(tmp_path / "fit"))
    np.testing.assert_array_equal(back.predict(modes)[1], fp.predict(modes)[1])
    assert back.stats.extra.get("power_form") == "blend"


def test_a_physical_head_that_strays_over_the_domain_is_left_out(reference, nano) -> None:
    row = {tuple(m): i for i, m in enumerate(nano.modes_array.tolist())}
    idx = [row[m] for m in LOW_CORNER]
    s = Samples(nano.modes_array[idx], nano.time_ms[idx], nano.power_w[idx])
    blind = fit_ridge(s, reference)  # no domain: the block error alone chooses
    checked = fit_ridge(s, reference, domain=nano.modes_array)
    p_blind = blind.predict(nano.modes_array)[1]
    p_checked = checked.predict(nano.modes_array)[1]
    # Blind, the physical head wins the choice and reads the 1.5 GHz modes at ~3x their
    # power; over the domain it strays from the ridge head, which stays within reach.
    assert blind.stats.extra.get("power_form") == "physical"
    assert p_blind.max() > 2.0 * nano.power_w.max()
    assert "power_form" not in checked.stats.extra
    assert checked.stats.extra["power_physical_strayed"] > RidgeOptions().power_domain_ratio
    assert mape(p_checked, nano.power_w) < 0.5 * mape(p_blind, nano.power_w)
    assert p_checked.max() < 1.3 * nano.power_w.max()
    # the users' overall head (a blend) leaves the straying head out too
    assert np.allclose(checked.predict_overall(nano.modes_array)[1], p_checked)
    # with the check off, the domain changes nothing
    off = replace(RidgeOptions(), power_domain_ratio=0.0)
    same = fit_ridge(s, reference, off, domain=nano.modes_array)
    assert np.allclose(same.predict(nano.modes_array)[1], p_blind)
