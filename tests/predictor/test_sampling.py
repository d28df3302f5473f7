"""Profiling designs: k distinct modes, coverage, and front seeding."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.optimize.pareto import pareto_front
from powerd.predictor.sampling import POLICIES, front_members, rank_coords, select_modes


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("k", [1, 10, 50])
def test_k_distinct_indices(policy: str, k: int, nano, reference) -> None:
    pred = reference.predict(nano.modes_array)
    idx = select_modes(policy, nano.modes_array, k, predicted=pred, seed=1)
    assert len(idx) == k == len(set(idx.tolist()))
    assert idx.min() >= 0 and idx.max() < len(nano)


def test_k_larger_than_space_returns_all(nano) -> None:
    idx = select_modes("grid", nano.modes_array, 500)
    assert sorted(idx.tolist()) == list(range(len(nano)))


def test_grid_covers_every_axis_extreme(mobilenet) -> None:
    idx = select_modes("grid", mobilenet.modes_array, 20, seed=0)
    c = rank_coords(mobilenet.modes_array)[idx]
    # Maximin coverage reaches both ends of every knob, unlike a random draw of 20.
    assert np.all(c.min(0) == 0) and np.all(c.max(0) == 1)


def test_front_policy_seeds_the_predicted_front(mobilenet, reference) -> None:
    pt, pp = reference.predict(mobilenet.modes_array)
    idx = select_modes("front", mobilenet.modes_array, 30, predicted=(pt, pp), seed=0)
    front = set(pareto_front(pt, pp).tolist())
    on_front = sum(int(i) in front for i in idx)
    assert on_front >= 12  # ~half of k, spread along the front (a few may coincide)
    members = front_members(pt, pp, 15)
    assert set(members) <= set(idx.tolist())
    assert pp[members[0]] == pytest.approx(pp[list(front)].min())


def test_seeded_and_reproducible(mobilenet) -> None:
    a = select_modes("random", mobilenet.modes_array, 30, seed=4)
    b = select_modes("random", mobilenet.modes_array, 30, seed=4)
    np.testing.assert_array_equal(a, b)


def test_unknown_policy_and_missing_prediction(nano) -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        select_modes("best", nano.modes_array, 5)
    with pytest.raises(ValueError, match="needs the reference"):
        select_modes("front", nano.modes_array, 5)
