"""Covering the rate axis (planner level, a synthetic model, no daemon): a new workload or
budget measures pairs until every arrival rate some pair fits at its latency target and
budget is fitted by a measured pair, so that a later rate change is served from measured
pairs, and the covering is bounded."""

from __future__ import annotations

import numpy as np
from pair_models import MODES, SIZES, Model, exact, pair

from powerd.optimize.inference import (
    COVER_EXTRA_PAIRS,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    fit_for,
)


def rates_fitted(goal: InferenceGoal, pairs) -> np.ndarray:
    """Which rates of a fine ladder (1-5000/s) some of `pairs` fits at the goal's latency
    target and budget, measured exactly."""
    rates = np.geomspace(1.0, 5000.0, 400)
    return np.array(
        [
            any(
                fit_for(exact(q), InferenceGoal(float(r), goal.budget_w, goal.latency_ms))
                for q in pairs
            )
            for r in rates
        ]
    )


ALL_PAIRS = [pair(g, b) for g in (1, 2, 3) for b in SIZES]


def settle(session: InferenceSession, samples: dict, measure=exact) -> tuple[ServePair, list]:
    """Run the session to a ServePair; (what it serves, the actions measured on the way)."""
    taken = []
    while isinstance(action := session.next_action(samples), MeasurePair):
        taken.append(action)
        samples[action.pair] = measure(action.pair)
        session.measured(action.pair)
    return action, taken


def test_a_new_workload_covers_the_rate_axis_then_a_rate_change_measures_nothing() -> None:
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model())
    samples: dict[Pair, PairMeasurement] = {}
    # 50/s and 20 ms: b=1 at the slowest clock fits (7 ms, 8.1 W)
    session = InferenceSession(pl, InferenceGoal(rate_hz=50, budget_w=20, latency_ms=20))
    first, taken = settle(session, samples)
    assert first.feasible and first.pair == pair(1, 1)
    # every rate some pair fits at 20 ms and 20 W is fitted by a measured pair
    assert any(a.cover for a in taken)
    assert (rates_fitted(session.goal, samples) == rates_fitted(session.goal, ALL_PAIRS)).all()
    # 500/s with 20 ms: b=1 cannot drain (0.9 * 2 ms), b=16 waits 30 ms to fill; only b=4 at
    # g >= 2 fits. The covering measured g=3, b=4: the re-solve serves it, measuring nothing.
    session.set_rate(500)
    second, taken = settle(session, samples)
    assert taken == []
    assert second.feasible and second.pair == pair(3, 4)
    assert fit_for(samples[second.pair], session.goal)


def test_without_covering_the_same_rate_change_has_to_measure() -> None:
    """The contrast: the first goal's search alone (no covering) leaves b=4 unmeasured."""
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model())
    samples: dict[Pair, PairMeasurement] = {}
    goal = InferenceGoal(rate_hz=50, budget_w=20, latency_ms=20)
    while isinstance(action := pl.next_action(goal, samples), MeasurePair):
        samples[action.pair] = exact(action.pair)
    assert not any(q.batch_size == 4 for q in samples)
    fast = InferenceGoal(rate_hz=500, budget_w=20, latency_ms=20)
    assert not any(fit_for(m, fast) for m in samples.values())


def test_a_budget_change_covers_at_the_new_budget() -> None:
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model())
    samples: dict[Pair, PairMeasurement] = {}
    session = InferenceSession(pl, InferenceGoal(rate_hz=50, budget_w=20, latency_ms=20))
    settle(session, samples)
    before = set(samples)
    session.set_budget(13)  # g=3 (14.1-15.6 W) is over; g=2 (11.1-12.6 W) is the fastest
    served, taken = settle(session, samples)
    covered = [a.pair for a in taken if a.cover]
    # the rates g=3 served at 20 ms are covered at 13 W by g=2 at b=1 and b=4; b=16 fills
    # in 15/r, so it fits no rate at 20 ms (its 18.5 ms batch drains only below 778/s)
    assert covered and set(covered) == {pair(2, 1), pair(2, 4)} - before
    assert (rates_fitted(session.goal, samples) == rates_fitted(session.goal, ALL_PAIRS)).all()
    assert session.new_pairs == len(taken) - len(covered)  # covering has its own allowance
    assert served.feasible and samples[served.pair].power_w <= 13


def test_covering_is_bounded_when_the_model_keeps_promising_faster_pairs() -> None:
    class Promising:
        """Every unmeasured pair predicted at 1 ms and 6 W: a batch size never looks covered."""

        def __init__(self, samples):
            self.samples = samples

        def predict(self, modes, b):
            return np.ones(len(b)), np.full(len(b), 6.0)

    modes = np.array([(4, 1000, g, 1000) for g in range(1, 9)])
    pl = InferencePlanner(modes, SIZES, Promising, max_pairs=30)
    samples: dict[Pair, PairMeasurement] = {}

    def measure(q: Pair) -> PairMeasurement:
        return PairMeasurement(q, 50.0, 6.0, 50.0, 50)

    session = InferenceSession(pl, InferenceGoal(rate_hz=10, budget_w=20, latency_ms=500))
    served, taken = settle(session, samples, measure)
    assert isinstance(served, ServePair)
    assert sum(a.cover for a in taken) == len(SIZES) + COVER_EXTRA_PAIRS
    # a rate change does not cover again
    session.set_rate(12)
    _, taken = settle(session, samples, measure)
    assert not any(a.cover for a in taken)


def test_a_first_goal_nothing_drains_still_covers_the_rate_axis() -> None:
    """2000/s: no pair drains (b=16 at g=3 takes 12.3 ms, the drain limit is 7.2 ms), so the
    first goal has no seed and is served infeasible after measuring the pair that serves
    the most requests. It covers the rate axis all the same: a later 100/s (where b=16
    fills in 150 ms, over the 100 ms target) is served from measured pairs."""
    pl = InferencePlanner(MODES, SIZES, lambda samples: Model())
    samples: dict[Pair, PairMeasurement] = {}
    session = InferenceSession(pl, InferenceGoal(rate_hz=2000, budget_w=20, latency_ms=100))
    first, taken = settle(session, samples)
    assert not first.feasible and any(a.cover for a in taken)
    assert (rates_fitted(session.goal, samples) == rates_fitted(session.goal, ALL_PAIRS)).all()
    session.set_rate(100)
    second, taken = settle(session, samples)
    assert taken == [] and second.feasible
    assert fit_for(samples[second.pair], session.goal)
