"""Batch-size-aware predictors: the inference reference and the transfer towards a prior."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.modes import PowerMode
from powerd.optimize.inference import Pair, PairMeasurement
from powerd.predictor.batch import (
    InferenceReference,
    TrainingReferenceWithBatch,
    fit_pair_model,
    load_prior,
)
from powerd_replay.inference import PairTrace


def mape(a, b) -> float:
    return float(np.mean(np.abs(a / b - 1)))


def samples_of(trace: PairTrace, idx) -> dict[Pair, PairMeasurement]:
    out = {}
    for i in idx:
        pair = Pair(PowerMode(*map(int, trace.modes_all[i])), int(trace.b_all[i]))
        out[pair] = PairMeasurement(pair, float(trace.t_all[i]), float(trace.p_all[i]))
    return out


def test_reference_roundtrip_and_batch_dependence(resnet_pairs, tmp_path) -> None:
    ref = InferenceReference.fit(
        resnet_pairs.modes_all, resnet_pairs.b_all, resnet_pairs.t_all, resnet_pairs.p_all
    )
    ref.save(tmp_path / "r.json")
    again = InferenceReference.load(tmp_path / "r.json")
    t1, p1 = ref.predict(resnet_pairs.modes_all, resnet_pairs.b_all)
    t2, p2 = again.predict(resnet_pairs.modes_all, resnet_pairs.b_all)
    np.testing.assert_allclose(t1, t2)
    np.testing.assert_allclose(p1, p2)
    assert mape(t1, resnet_pairs.t_all) < 0.2 and mape(p1, resnet_pairs.p_all) < 0.1
    mode = np.repeat(resnet_pairs.modes_all[:1], 2, axis=0)
    t, _ = ref.predict(mode, np.array([1, 64]))
    assert t[1] > 3 * t[0]  # a batch of 64 takes much longer than a batch of 1


# Held-out MAPE bounds after 20 samples: the inference-corpus prior transfers better.
@pytest.mark.parametrize(
    ("method", "t_max", "p_max"), [("infer-ref", 0.25, 0.10), ("train-head", 0.30, 0.15)]
)
def test_transfer_to_an_unseen_workload_improves_on_the_prior(
    mobilenet_pairs, method, t_max, p_max
) -> None:
    prior = load_prior(method)
    rng = np.random.default_rng(1)
    idx = rng.choice(len(mobilenet_pairs.t_all), 20, replace=False)
    fitted = fit_pair_model(prior, samples_of(mobilenet_pairs, idx), method)
    t, p = fitted.predict(mobilenet_pairs.modes_all, mobilenet_pairs.b_all)
    t0, p0 = prior.predict(mobilenet_pairs.modes_all, mobilenet_pairs.b_all)
    assert mape(t, mobilenet_pairs.t_all) < mape(t0, mobilenet_pairs.t_all)
    assert mape(p, mobilenet_pairs.p_all) < mape(p0, mobilenet_pairs.p_all)
    assert mape(t, mobilenet_pairs.t_all) < t_max and mape(p, mobilenet_pairs.p_all) < p_max


def test_one_sample_shifts_the_prior_through_it(mobilenet_pairs) -> None:
    prior = load_prior("infer-ref")
    s = samples_of(mobilenet_pairs, [100])
    fitted = fit_pair_model(prior, s, "infer-ref")
    (m,) = s.values()
    t, p = fitted.predict(np.array([m.pair.mode.as_tuple()]), np.array([m.pair.batch_size]))
    # One sample, strongest pull to the prior: close to the sample, not necessarily exact.
    assert t[0] == pytest.approx(m.batch_ms, rel=0.15)
    assert p[0] == pytest.approx(m.power_w, rel=0.05)


def test_training_prior_ignores_batch_size_until_fitted() -> None:
    class Fixed:
        calls = 0

        def predict(self, modes):
            Fixed.calls += 1
            return np.full(len(modes), 100.0), np.full(len(modes), 20.0)

    prior = TrainingReferenceWithBatch(Fixed())
    modes = np.array([[4, 422400, 114750000, 665600000]] * 2)
    t, _ = prior.predict(modes, np.array([1, 64]))
    assert t[0] == t[1] == 100.0
    prior.predict(modes, np.array([1, 64]))
    assert Fixed.calls == 1  # the grid's reference outputs are computed once
