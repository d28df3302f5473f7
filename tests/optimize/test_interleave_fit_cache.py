"""The interleaving planner refits only when the samples it fits on change: a refit over the
daemon's grid costs ~0.6 s of the daemon's one thread, and it asks on every tick."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pair_models import MODES, SIZES, Model, exact, pair

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.interleave import InterleaveGoal, InterleavePlanner, ServeJoint

GOAL = InterleaveGoal(10.0, 25.0, 5000.0)


class _CountingFitter:
    """A fitter that counts its fits; its model is shifted by the mean measured power error
    (so the predictions show which samples they were fitted to)."""

    def __init__(self) -> None:
        self.fits = 0

    def __call__(self, samples):
        self.fits += 1
        return self.model(self.offset(samples) if samples else 0.0)


@dataclasses.dataclass
class _Shifted:
    offset: float

    def predict(self, modes, b):
        t, p = Model().predict(modes, b)
        return t, p + self.offset


class PairFitter(_CountingFitter):
    """The synthetic pair model."""

    model = _Shifted

    def offset(self, samples) -> float:
        ms = list(samples.values())
        modes = np.array([m.pair.mode.as_tuple() for m in ms])
        _, p = Model().predict(modes, np.array([m.pair.batch_size for m in ms]))
        return float(np.mean([m.power_w for m in ms] - p))


@dataclasses.dataclass
class _Train:
    offset: float

    def predict(self, modes):
        g = np.asarray(modes)[:, 2].astype(float)
        return 50.0 / g, 6 + 2 * g + self.offset


class TrainFitter(_CountingFitter):
    """Step time 50 ms / g, power 6 + 2g W."""

    model = _Train

    def offset(self, samples) -> float:
        return float(np.mean([m.power_w - (6 + 2 * m.mode.gpu_hz) for m in samples.values()]))


def step(g: int, power_w: float | None = None) -> Measurement:
    mode = PowerMode(4, 1000, g, 1000)
    return Measurement(mode, 50.0 / g, 6 + 2 * g if power_w is None else power_w, 20)


@pytest.fixture
def fitters():
    return PairFitter(), TrainFitter()


@pytest.fixture
def planner(fitters) -> InterleavePlanner:
    return InterleavePlanner(MODES, SIZES, fitters[1], fitters[0])


def test_unchanged_samples_are_fitted_once(planner, fitters) -> None:
    pf, tf = fitters
    train = {step(1).mode: step(1)}
    infer = {pair(1, 4): exact(pair(1, 4))}
    first = planner.predictions(train, infer)
    # the daemon builds the maps anew on every tick: the same contents reuse the fit
    again = planner.predictions(dict(train), dict(infer))
    a1 = planner.next_action(GOAL, train, infer)
    a2 = planner.next_action(GOAL, {**train}, {**infer})
    assert (pf.fits, tf.fits) == (1, 1)
    assert a1 == a2
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_new_or_replaced_inference_pair_refits(planner, fitters) -> None:
    pf, tf = fitters
    train = {step(1).mode: step(1)}
    infer = {pair(1, 4): exact(pair(1, 4))}
    p0 = planner.predictions(train, infer)[1]
    np.testing.assert_allclose(p0, Model().predict(planner.grid_modes, planner.grid_b)[1])

    # a new pair, measured 2 W over the model: the mean error is 1 W
    infer[pair(2, 16)] = dataclasses.replace(
        exact(pair(2, 16)), power_w=exact(pair(2, 16)).power_w + 2
    )
    p1 = planner.predictions(train, infer)[1]
    assert pf.fits == 2
    np.testing.assert_allclose(p1, p0 + 1.0)
    # the training side refits too: its fitter may read the inference samples
    assert tf.fits == 2

    # the same pair measured again (a replaced reading, same number of windows): 4 W over
    infer[pair(2, 16)] = dataclasses.replace(
        infer[pair(2, 16)], power_w=exact(pair(2, 16)).power_w + 4
    )
    p2 = planner.predictions(train, infer)[1]
    assert pf.fits == 3
    np.testing.assert_allclose(p2, p0 + 2.0)

    planner.predictions(train, infer)
    assert pf.fits == 3


def test_a_new_or_replaced_training_step_refits_the_training_side_only(planner, fitters) -> None:
    pf, tf = fitters
    train = {step(1).mode: step(1)}
    infer = {pair(1, 4): exact(pair(1, 4))}
    pt0 = planner.predictions(train, infer)[3]

    train[step(2).mode] = step(2, power_w=6 + 4 + 3.0)  # 3 W over: mean error 1.5 W
    pt1 = planner.predictions(train, infer)[3]
    assert (pf.fits, tf.fits) == (1, 2)
    np.testing.assert_allclose(pt1, pt0 + 1.5)

    train[step(2).mode] = step(2, power_w=6 + 4 + 1.0)  # replaced: mean error 0.5 W
    pt2 = planner.predictions(train, infer)[3]
    assert (pf.fits, tf.fits) == (1, 3)
    np.testing.assert_allclose(pt2, pt0 + 0.5)


def test_a_solve_fits_once_per_new_measurement_and_not_while_it_serves(planner, fitters) -> None:
    pf, tf = fitters
    train, infer, probes = {}, {}, 0
    for _ in range(20):
        action = planner.next_action(GOAL, train, infer, probes)
        if isinstance(action, ServeJoint):
            break
        infer[action.pair] = exact(action.pair)
        train.setdefault(action.pair.mode, step(action.pair.mode.gpu_hz))
        probes += 1
    assert isinstance(action, ServeJoint) and probes >= 1
    assert (pf.fits, tf.fits) == (probes + 1, probes + 1)
    # the daemon's ticks while it serves: nothing new, no refit, the same answer
    for _ in range(3):
        assert planner.next_action(GOAL, dict(train), dict(infer), probes) == action
    assert (pf.fits, tf.fits) == (probes + 1, probes + 1)


def test_the_cached_predictions_cannot_be_written(planner) -> None:
    for a in planner.predictions({}, {}):
        with pytest.raises(ValueError):
            a[0] = 0.0
