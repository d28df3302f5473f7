"""Pareto front and lookups, checked against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerd.optimize.pareto import fastest_under, next_lower_on_front, pareto_front, walk_down


def brute_front(t: np.ndarray, p: np.ndarray) -> set[int]:
    """O(n^2) definition: not dominated, and the lowest index among exact duplicates."""
    out = set()
    for i in range(len(t)):
        if np.isnan(t[i]) or np.isnan(p[i]):
            continue
        dominated = False
        for j in range(len(t)):
            if j == i or np.isnan(t[j]) or np.isnan(p[j]):
                continue
            better_eq = t[j] <= t[i] and p[j] <= p[i]
            strict = t[j] < t[i] or p[j] < p[i]
            if (better_eq and strict) or (t[j] == t[i] and p[j] == p[i] and j < i):
                dominated = True
                break
        if not dominated:
            out.add(i)
    return out


# Small integer grids make ties and exact duplicates common, where front code usually breaks.
values = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(values)
def test_front_matches_brute_force(pairs: list[tuple[int, int]]) -> None:
    t = np.array([a for a, _ in pairs], dtype=float)
    p = np.array([b for _, b in pairs], dtype=float)
    f = pareto_front(t, p)
    assert set(f.tolist()) == brute_front(t, p)
    assert len(set(f.tolist())) == len(f)
    # Sorted by power ascending; along the front time must then strictly fall.
    assert np.all(np.diff(p[f]) > 0)
    assert np.all(np.diff(t[f]) < 0)


@settings(max_examples=300, deadline=None)
@given(values, st.floats(-1, 7))
def test_fastest_under_matches_brute_force(pairs: list[tuple[int, int]], budget: float) -> None:
    t = np.array([a for a, _ in pairs], dtype=float)
    p = np.array([b for _, b in pairs], dtype=float)
    got = fastest_under(t, p, budget)
    ok = [i for i in range(len(t)) if p[i] <= budget]
    if not ok:
        assert got is None
        return
    want = min(ok, key=lambda i: (t[i], p[i], i))
    assert got == want
    assert got in set(pareto_front(t, p).tolist())


def test_fastest_under_exclude_indices_and_mask() -> None:
    t = np.array([10.0, 5.0, 7.0, 20.0])
    p = np.array([3.0, 9.0, 6.0, 1.0])
    assert fastest_under(t, p, 9.0) == 1
    assert fastest_under(t, p, 9.0, exclude=[1]) == 2
    assert fastest_under(t, p, 9.0, exclude=np.array([False, True, True, False])) == 0
    assert fastest_under(t, p, 0.5) is None
    with pytest.raises(ValueError):
        fastest_under(t, p, 9.0, exclude=np.array([True, False]))


def test_nan_modes_are_never_chosen() -> None:
    t = np.array([1.0, np.nan, 3.0])
    p = np.array([np.nan, 1.0, 2.0])
    assert pareto_front(t, p).tolist() == [2]
    assert fastest_under(t, p, 10.0) == 2


def test_walk_down_steps_through_lower_front_members() -> None:
    rng = np.random.default_rng(0)
    t = rng.uniform(50, 500, 300)
    p = rng.uniform(10, 50, 300)
    f = pareto_front(t, p)
    top = int(f[-1])
    assert list(walk_down(t, p, top)) == f[:-1][::-1].tolist()
    assert next_lower_on_front(t, p, int(f[0])) is None
    # From a mode off the front: the front member with the highest power below it.
    off = int(np.setdiff1d(np.arange(300), f)[0])
    nxt = next_lower_on_front(t, p, off, f)
    below = f[p[f] < p[off]]
    assert nxt == (int(below[-1]) if below.size else None)
    assert next_lower_on_front(t, p, top, f, exclude=[int(f[-2])]) == int(f[-3])
    with pytest.raises(IndexError):
        next_lower_on_front(t, p, 300)


def test_mismatched_lengths_rejected() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        pareto_front(np.zeros(3), np.zeros(4))


def test_a_large_mode_space_front_is_consistent() -> None:
    # its speed is a benchmark figure (tools/bench_predictor.py), not asserted here
    rng = np.random.default_rng(1)
    t = rng.uniform(50, 2000, 18_000)
    p = rng.uniform(10, 60, 18_000)
    f = pareto_front(t, p)
    assert len(f) > 0
    for b in range(10, 61):
        i = fastest_under(t, p, float(b))
        under = p <= b
        if i is None:
            assert not under.any()
        else:
            assert p[i] <= b and t[i] == t[under].min()
