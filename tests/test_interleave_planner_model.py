"""The interleave planner solves with the training job's fitted model as it is when asked:
a model that finishes fitting after the planner was built, or another training job's,
replaces the one the planner started with (its predictions are cached by the samples,
which need not change when the model does)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from powerd.interleave_planner import InterleaveJobsPlanner

MODES = np.array([(4, 1_000_000, g, 665_000_000) for g in (300_000_000, 600_000_000)])


def _planner(train: dict) -> InterleaveJobsPlanner:
    # only what choosing the solver reads: the training jobs, the grid, the pair fitter
    p = object.__new__(InterleaveJobsPlanner)
    p._planners, p.train, p.released = {}, train, {}
    p.modes, p.settings = MODES, SimpleNamespace(max_pairs=30)
    p.fitter_factory = lambda: lambda samples: None
    return p


def test_a_training_model_fitted_later_replaces_the_one_the_solver_started_with() -> None:
    first, later = object(), object()
    side = SimpleNamespace(predictor=first)
    p = _planner({"t1": (SimpleNamespace(id="t1", registered=1.0), side)})
    solver = p._planner((1, 4))
    assert solver.train_fitter({}) is first
    assert p._planner((1, 4)) is solver  # unchanged model: the same solver and its cache
    side.predictor = later
    assert p._planner((1, 4)).train_fitter({}) is later


def test_another_training_job_brings_its_own_model() -> None:
    a, b = object(), object()
    train = {"a": (SimpleNamespace(id="a", registered=1.0), SimpleNamespace(predictor=a))}
    p = _planner(train)
    assert p._planner((1, 4)).train_fitter({}) is a
    del train["a"]
    train["b"] = (SimpleNamespace(id="b", registered=2.0), SimpleNamespace(predictor=b))
    assert p._planner((1, 4)).train_fitter({}) is b
