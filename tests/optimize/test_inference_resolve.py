"""Re-solves of a profiled inference workload (planner level, a synthetic model, no daemon):
a later goal's budget of measurements past max_pairs, probing a draining pair when none
measured drains, and the drain judged on the median batch time."""

from __future__ import annotations

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.inference import (
    RESOLVE_MAX_PAIRS,
    RESOLVE_NEW_PAIRS,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    fit_for,
    serves_within_budget,
)

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
SIZES = (1, 4, 16)


class Model:
    """Batch time (5 + 2b)/g ms, power 5 + 3g + 0.1b W: faster GPU clocks draw more."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(float)
        b = np.asarray(b, float)
        return (5 + 2 * b) / g, 5 + 3 * g + 0.1 * b


def exact(pair: Pair) -> PairMeasurement:
    t, p = Model().predict(np.array([pair.mode.as_tuple()]), np.array([pair.batch_size]))
    return PairMeasurement(pair, float(t[0]), float(p[0]), float(t[0]), 50)


def pair(g: int, b: int) -> Pair:
    return Pair(PowerMode(4, 1000, g, 1000), b)


def first_goal_samples() -> dict[Pair, PairMeasurement]:
    """The first goal spent the whole max_pairs (3) on batch size 1."""
    return {q: exact(q) for q in (pair(1, 1), pair(2, 1), pair(3, 1))}


def planner() -> InferencePlanner:
    return InferencePlanner(MODES, SIZES, lambda samples: Model(), max_pairs=3)


def test_drain_is_judged_on_the_median_batch_time_latency_on_the_tail() -> None:
    goal = InferenceGoal(rate_hz=100, budget_w=20, latency_ms=100)  # drain limit b=4: 36 ms
    m = PairMeasurement(pair(1, 4), batch_ms=33.0, power_w=9.0, batch_p99_ms=38.0, batches=50)
    assert serves_within_budget(m, goal) and fit_for(m, goal)  # 38 ms p99 over 36: jitter
    slow = PairMeasurement(pair(1, 4), batch_ms=37.0, power_w=9.0, batch_p99_ms=38.0)
    assert not serves_within_budget(slow, goal)  # the typical batch does not drain
    late = PairMeasurement(pair(1, 4), batch_ms=33.0, power_w=9.0, batch_p99_ms=75.0)
    assert not fit_for(late, goal)  # 30 ms fill + 75 ms p99 > 100 ms: the tail counts


def test_a_later_goal_verifies_its_predicted_pick_past_max_pairs() -> None:
    pl, samples = planner(), first_goal_samples()
    goal = InferenceGoal(rate_hz=200, budget_w=20, latency_ms=100)
    assert any(fit_for(m, goal) for m in samples.values())  # g=2, b=1 fits at 11.1 W
    # The model's least-power pick (g=1, b=4: 8.4 W) was never measured: verify it.
    action = pl.next_action(goal, samples, new_pairs=0, new_pairs_limit=RESOLVE_NEW_PAIRS)
    assert action == MeasurePair(pair(1, 4))
    samples[action.pair] = exact(action.pair)
    served = pl.next_action(goal, samples, new_pairs=1, new_pairs_limit=RESOLVE_NEW_PAIRS)
    assert isinstance(served, ServePair) and served.feasible and served.pair == pair(1, 4)
    # A first goal still stops at max_pairs.
    assert isinstance(pl.next_action(goal, first_goal_samples()), ServePair)


def test_a_rate_change_serves_a_measured_fit_pair_without_measuring() -> None:
    samples = first_goal_samples()
    session = InferenceSession(planner(), InferenceGoal(rate_hz=50, budget_w=20, latency_ms=100))
    session.set_rate(200)  # g=2, b=1 (measured) fits; the model predicts g=1, b=4 better
    action = session.next_action(samples)
    assert isinstance(action, ServePair) and action.feasible and action.pair == pair(2, 1)
    # a budget change with the same pairs verifies the better predicted pick
    session.set_budget(19)
    assert session.next_action(samples) == MeasurePair(pair(1, 4))


def test_rate_jump_with_no_draining_pair_probes_the_best_predicted_draining_pair() -> None:
    samples = first_goal_samples()
    session = InferenceSession(planner(), InferenceGoal(rate_hz=50, budget_w=20, latency_ms=100))
    session.set_rate(500)  # no b=1 pair drains
    assert not any(serves_within_budget(m, session.goal) for m in samples.values())
    probes = []
    while isinstance(action := session.next_action(samples), MeasurePair):
        probes.append(action.pair)
        samples[action.pair] = exact(action.pair)
        session.measured(action.pair)
    # first probe: predicted to drain within the budget and the latency, least power
    assert probes[0] == pair(2, 4) and len(probes) <= RESOLVE_MAX_PAIRS
    assert action.feasible and serves_within_budget(samples[action.pair], session.goal)
    assert action.pair == pair(2, 4)  # 6.5 ms <= 7.2 ms at 11.4 W


def test_a_resolve_with_a_wrong_model_stops_after_its_own_budget() -> None:
    class Wrong:
        def predict(self, modes, b):
            return np.ones(len(b)), np.ones(len(b))  # everything fits at 1 ms, 1 W

    pl = InferencePlanner(MODES, SIZES, lambda s: Wrong(), max_pairs=3)
    samples = first_goal_samples()
    goal = InferenceGoal(rate_hz=500, budget_w=9, latency_ms=100)  # nothing truly fits
    new = 0
    while True:
        action = pl.next_action(goal, samples, new_pairs=new, new_pairs_limit=RESOLVE_NEW_PAIRS)
        if isinstance(action, ServePair):
            break
        samples[action.pair] = exact(action.pair)
        new += 1
    assert new == RESOLVE_MAX_PAIRS and not action.feasible
