"""The replay harness itself: measurement model, stand-in predictors, the judge's arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import Commit, Measure, Measurement, Strategy
from powerd.sim.trace import Trace
from powerd_replay.training import (
    GridSpace,
    NoiseModel,
    NoisyOracle,
    RidgeFitter,
    TraceMeasurer,
    TracePredictor,
    default_budgets,
    format_table,
    is_held_out,
    replay_sweep,
    sample_label,
    trace_label,
)


def test_grid_space_matches_trace_axes(nano: Trace) -> None:
    space = GridSpace.from_trace(nano)
    assert space.size == len(nano) == len(space.modes()) == len(space.as_array())
    assert space.max_mode() == PowerMode(6, 1510400, 624750000, 2133000000)
    assert space.min_mode() == PowerMode(2, 268800, 306000000, 665600000)
    modes = space.modes()
    assert all(space.contains(m) for m in modes)
    assert [space.index(m) for m in modes[:7]] == list(range(7))
    assert not space.contains(PowerMode(3, 268800, 306000000, 665600000))


def test_measurer_noise_is_deterministic_and_small(nano: Trace) -> None:
    mode = nano.rows[40].mode
    a = TraceMeasurer(nano, NoiseModel(seed=3)).measure(mode, 100.0)
    b = TraceMeasurer(nano, NoiseModel(seed=3)).measure(mode, 100.0)
    assert a == b
    times = []
    m = TraceMeasurer(nano, NoiseModel(seed=1))
    for _ in range(200):  # repeated measures of one mode draw fresh noise
        times.append(m.measure(mode, 100.0).time_ms)
    rel = np.std(np.log(times))
    assert 0.01 < rel < 0.03


def test_measurer_aborts_clearly_over_budget(nano: Trace) -> None:
    top = GridSpace.from_trace(nano).max_mode()  # ~20 W
    m = TraceMeasurer(nano, NoiseModel(seed=0, power_w=0.0))
    over = m.measure(top, budget_w=10.0)
    assert over.aborted_over_budget and math.isnan(over.time_ms) and over.power_w > 11.0
    near = m.measure(top, budget_w=19.9)  # over by less than the abort margin: measured
    assert not near.aborted_over_budget and math.isfinite(near.time_ms)


def test_noisy_oracle_errors_are_in_the_stated_range(mobilenet: Trace) -> None:
    oracle = NoisyOracle(mobilenet, time_err=0.10, power_err=0.05, jitter=0.02, seed=0)
    t, p = oracle.predict(mobilenet.modes_array)
    terr = np.abs(np.log(t / mobilenet.time_ms))
    perr = np.abs(np.log(p / mobilenet.power_w))
    assert 0.02 < np.median(terr) < 0.2
    assert 0.005 < np.median(perr) < 0.1


def test_ridge_fitter_learns_the_systematic_part(mobilenet: Trace) -> None:
    oracle = NoisyOracle(mobilenet, time_err=0.15, power_err=0.08, jitter=0.0, seed=4)
    fitter = RidgeFitter(oracle, [mobilenet.axis(f) for f in FIELDS])
    rng = np.random.default_rng(0)
    rows = [mobilenet.rows[i] for i in rng.choice(len(mobilenet), 40, replace=False)]
    samples = {r.mode: Measurement(r.mode, r.time_ms, r.power_w, 10) for r in rows}
    t0, p0 = oracle.predict(mobilenet.modes_array)
    t1, p1 = fitter(samples).predict(mobilenet.modes_array)
    err = lambda x, y: float(np.median(np.abs(np.log(x / y))))  # noqa: E731
    assert err(t1, mobilenet.time_ms) < err(t0, mobilenet.time_ms)
    assert err(p1, mobilenet.power_w) < err(p0, mobilenet.power_w)


def test_trace_predictor_is_the_trace(nano: Trace) -> None:
    t, p = TracePredictor(nano).predict(nano.modes_array)
    assert np.allclose(t, nano.time_ms) and np.allclose(p, nano.power_w)


class _PinMode(Strategy):
    """Measures one mode, then commits it: to check the judge's arithmetic."""

    name = "pin"

    def __init__(self, mode: PowerMode):
        self.mode = mode

    def next_action(self, budget_w, samples):
        return Commit(self.mode) if self.mode in samples else Measure(self.mode)


def test_sweep_judges_against_the_brute_force_best(nano: Trace) -> None:
    mode = nano.rows[100].mode
    budgets = default_budgets(nano)
    assert budgets == tuple(float(b) for b in range(8, 21))
    res = replay_sweep(_PinMode(mode), nano, budgets, noise=NoiseModel(seed=0))
    row = nano.exact(mode)
    assert row is not None
    for r in res.rows:
        best = nano.best_under(r.budget_w)
        assert r.best_time_ms == pytest.approx(best.time_ms)
        assert r.penalty == pytest.approx(row.time_ms / best.time_ms - 1)
        assert r.overshoot_w == pytest.approx(max(0.0, row.power_w - r.budget_w))
    assert [r.new_probes for r in res.rows] == [1] + [0] * (len(budgets) - 1)
    assert res.distinct_modes == 1
    over = [r.overshoot_w > 0.5 for r in res.rows]
    assert res.share_over == pytest.approx(sum(over) / len(over))
    assert "median penalty" in format_table(res)


def test_own_range_budgets_span_the_workloads_power_range():
    from powerd.sim.trace import TRACE_DIR
    from powerd_replay.training import load_trace, own_range_budgets

    trace = load_trace(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_infer.csv", batch_size=1)
    assert trace.name == "orin_agx_mobilenetv3_gld23k_infer@bs1"
    assert len(trace) == 441  # one batch size only
    budgets = own_range_budgets(trace)
    assert budgets[0] >= trace.power_w.min() + 1.0 > budgets[0] - 1.0
    assert budgets[-1] >= trace.power_w.max() > budgets[-2]
    assert all(b - a == 1.0 for a, b in zip(budgets, budgets[1:], strict=False))


def test_mixed_order_steps_down_and_is_seeded():
    from powerd_replay.training import mixed_order

    budgets = [float(b) for b in range(10, 30)]
    a, b = mixed_order(budgets, 0), mixed_order(budgets, 0)
    assert a == b and sorted(a) == budgets and a != budgets
    assert any(y < x for x, y in zip(a, a[1:], strict=False))
    assert mixed_order(budgets, 1) != a


def test_the_held_out_trace_is_held_out_at_every_batch_size():
    held = "orin_agx_mobilenetv3_gld23k_infer"
    for bs in (1, 4, 16, 64):
        label = trace_label(f"powerd/sim/traces/{held}.csv", bs)
        assert is_held_out(label) and sample_label(label) == "held-out"
    for other in ("orin_agx_resnet18_imagenet_infer@bs1", "orin_nano_resnet18_imagenet_train"):
        assert not is_held_out(other) and sample_label(other) == "in-sample"
    # a name that only starts like the held-out trace is another trace
    assert not is_held_out(held + "_v2@bs1")
